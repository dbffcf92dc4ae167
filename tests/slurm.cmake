# The sbatch template under a real local Slurm (srun --mpi=pmix) against mpirun.
add_test(NAME slurm_sbatch_srun
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(slurm_sbatch_srun PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi;slurm")
# Preemption: USR1 to the batch shell, checkpoint, requeue, resume (tests/slurm/requeue_test.sh).
add_test(NAME slurm_requeue_resume
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/requeue_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(slurm_requeue_resume PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi;slurm")
