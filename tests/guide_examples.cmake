# The output lines quoted in docs/guide.md match what the program prints and writes.
add_test(NAME guide_examples
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/guide_examples.sh $<TARGET_FILE:turbozero>
    ${CMAKE_SOURCE_DIR}
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(guide_examples PROPERTIES TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
