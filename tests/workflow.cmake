# The researcher's workflow: the memory plan of any config (dry run, refusal before
# allocating), cores and Slurm checks at start-up (tests/train/plan_test.sh); run.json's
# segments, TensorBoard event files, eval agreeing with training, learning rates by mode
# (tests/train/records_test.sh).
add_test(NAME workflow_plan
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/plan_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(workflow_plan PROPERTIES TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e;mpi")
add_test(NAME workflow_records
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/records_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(workflow_records PROPERTIES TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
