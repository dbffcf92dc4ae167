# ZeRO stages 0/1/2 over 1-4 MPI ranks: equal losses and parameters, shard sizes, a failing
# rank stopping the job (tests/zero/zero_test.sh).
add_test(NAME zero_mpi_equivalence
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/zero/zero_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(zero_mpi_equivalence PROPERTIES TIMEOUT 1200
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")
