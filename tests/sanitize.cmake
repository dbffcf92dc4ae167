# The sanitizer build (TZ_SANITIZE=ON) as one test: builds a second tree, sanitize/, with the
# unit test targets under ASan + UBSan and runs its unit tests (tests/sanitize/). Not added
# inside that tree itself.
if(NOT TZ_SANITIZE)
  add_test(NAME sanitize_unit
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/sanitize/sanitize_test.sh ${CMAKE_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/sanitize)
  set_tests_properties(sanitize_unit PROPERTIES TIMEOUT 1200 PROCESSORS 2
    ENVIRONMENT "${TZ_TEST_ENV}" LABELS "sanitize")
endif()
