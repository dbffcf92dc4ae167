# Checkpoints: resume at the same and at other rank counts (LoRA, full, 4-bit base), SIGKILL
# at several moments, damaged checkpoints, failing writes, signals (tests/ckpt/ckpt_test.sh).
add_test(NAME ckpt_resume
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/ckpt_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_resume PROPERTIES TIMEOUT 900
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")

# Checkpoints and run.dir under hostile use: checkpoint.json edited or inconsistent, damaged
# but parseable shards, refused resumes, finished runs, going back, settings compared key by
# key, an overwrite killed early, a run.dir that is not a run folder (tests/ckpt/hostile_test.sh).
add_test(NAME ckpt_hostile
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/hostile_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_hostile PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")
