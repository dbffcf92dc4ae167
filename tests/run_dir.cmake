# The life of a run.dir: concurrent runs on one folder (the lock), failed runs leave the
# previous run whole, a write failure injected at each write, disk full on a small tmpfs
# (root only; skipped otherwise) (tests/train/run_dir_test.sh).
add_test(NAME run_dir_life
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/run_dir_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(run_dir_life PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
