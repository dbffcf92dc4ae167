# Checkpoints: resume at the same and at other rank counts (LoRA, full, 4-bit base), SIGKILL
# at several moments, damaged checkpoints, failing writes, signals (tests/ckpt/ckpt_test.sh).
add_test(NAME ckpt_resume
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/ckpt_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_resume PROPERTIES TIMEOUT 900
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")
