# DiT end to end on Fashion-MNIST: training lowers the loss, reproducibility, eval, LoRA on
# new classes, class-conditional sampling, bad input (tests/dit/dit_test.sh).
add_test(NAME dit_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dit/dit_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(dit_end_to_end PROPERTIES TIMEOUT 900 ENVIRONMENT "${TZ_TEST_ENV}"
  LABELS "e2e")
