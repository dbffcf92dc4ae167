# generate (deterministic greedy, reproducible sampling, an adapter changes the output) and
# export --merge (merged folders evaluate like base + adapter, dense and quantized bases).
add_test(NAME generate_export_merge
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/generate_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(generate_export_merge PROPERTIES TIMEOUT 300
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
