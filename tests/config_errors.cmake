# Config error paths: errors are fatal (exit non-zero), so a shell script drives a small
# loader (tz_config_check) over bad configs and checks each message. Also gives test_config
# the source folder so it can load inputs/reference.cfg.
add_executable(tz_config_check ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_config_check.c)
target_compile_options(tz_config_check PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_config_check PRIVATE tzcore)
target_compile_definitions(test_config PRIVATE TZ_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

add_test(NAME config_errors
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/config_errors.sh $<TARGET_FILE:tz_config_check>
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(config_errors PROPERTIES TIMEOUT 300
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick")
