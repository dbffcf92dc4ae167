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

# Signals during start-up (after the load, after the resume, before the first step): exit
# status 75 with nothing written, at 1 and 2 ranks, then a run or --resume that ends as the
# uninterrupted one; qzo too (tests/ckpt/signal_start_test.sh).
add_test(NAME ckpt_signal_start
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/signal_start_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_signal_start PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")

# A shard write that really fails (a file size limit on the writing rank): the error named on
# every rank, no crash, the previous checkpoint kept and resumable (tests/ckpt/full_disk_test.sh).
add_test(NAME ckpt_full_disk
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/full_disk_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_full_disk PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")

# export CHECKPOINT (LoRA and full: byte for byte the run stopped there, its recorded eval
# loss) and train.keep_best (tests/ckpt/export_test.sh).
add_test(NAME ckpt_export
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ckpt/export_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(ckpt_export PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")
