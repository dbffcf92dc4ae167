# End-to-end: LoRA fine-tuning lowers the validation loss, runs are reproducible bit for bit,
# eval agrees, full mode writes a loadable model, bad input is reported (tests/train/).
add_test(NAME train_llama_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/train_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(train_llama_end_to_end PROPERTIES TIMEOUT 900
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")

# The step model of bench --dry-run against the arithmetic of the llama-tiny recipe's shape
# (tests/train/step_model_test.sh).
add_test(NAME step_model
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/step_model_test.sh $<TARGET_FILE:turbozero>)
set_tests_properties(step_model PROPERTIES TIMEOUT 120 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick")

# optim.offload = false, the optimizer on the backend, against the host optimizer: losses,
# resume byte for byte, a host checkpoint resumed, refusals, the plan
# (tests/train/offload_device_test.sh).
add_test(NAME offload_device
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/offload_device_test.sh $<TARGET_FILE:turbozero>
          ${MPIEXEC_EXECUTABLE})
set_tests_properties(offload_device PROPERTIES TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "mpi")
