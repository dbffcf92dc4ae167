# Guards against hangs and bad inputs (tests/guard/): the collective watchdog (a stopped rank
# ends the job with a message naming it).
add_test(NAME guard_watchdog
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/guard/watchdog_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(guard_watchdog PROPERTIES TIMEOUT 300 PROCESSORS 2
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi;e2e")
# Inputs refused before they cost anything: ranks that see different files, a config.json
# that does not match the weights (checked before allocation), LoRA rank bounds, a wrapped
# token count, the warmup warning, BF16 overflow on save, a DiT file with a NaN.
add_test(NAME guard_inputs
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/guard/inputs_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(guard_inputs PROPERTIES TIMEOUT 300 PROCESSORS 2
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi;e2e")
