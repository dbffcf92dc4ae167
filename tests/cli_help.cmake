# Every command of the guide's command table answers --help (and turbozero help CMD) with exit
# 0 and a usage line, without MPI or files; --version names the build.
add_test(NAME cli_help
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli_help.sh $<TARGET_FILE:turbozero>
    ${CMAKE_SOURCE_DIR}/docs/guide.md
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(cli_help PROPERTIES TIMEOUT 60 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick")
