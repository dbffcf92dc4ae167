# The sbatch template under a real local Slurm (srun --mpi=pmix) against mpirun.
add_test(NAME slurm_sbatch_srun
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(slurm_sbatch_srun PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi;slurm")
