# docs/guide.md run top to bottom in a fresh clone (every shell block, in order, after the
# README's first command), and the output lines it quotes match what the program prints.
add_test(NAME guide_examples
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/guide_examples.sh $<TARGET_FILE:turbozero>
    ${CMAKE_SOURCE_DIR}
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(guide_examples PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
