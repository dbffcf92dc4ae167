# Fuzzing (tests/fuzz/): one libFuzzer target per parser. Target NAME is built from
# tests/fuzz/fuzz_NAME.c, starts from the seeds in tests/fuzz/corpus/NAME/ and first replays
# tests/fuzz/regress/NAME/ (inputs that once failed). Adding a target: its source file and its
# name in this list.
set(TZ_FUZZ_TARGETS tokenizer jsonl tokens safetensors hf_config config checkpoint flux_config
    latents_h5)
if(TZ_FUZZ)
  # the fuzz tree (TZ_FUZZ=ON, clang): the targets, each linked with libFuzzer's main
  foreach(t ${TZ_FUZZ_TARGETS})
    add_executable(fuzz_${t} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_${t}.c)
    target_compile_options(fuzz_${t} PRIVATE ${TZ_WARN} ${TZ_OPT})
    target_compile_definitions(fuzz_${t} PRIVATE TZ_FUZZ_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fuzz")
    target_link_libraries(fuzz_${t} PRIVATE tzcore)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  endforeach()
elseif(NOT TZ_SANITIZE)
  # the ordinary tree: one test that builds the fuzz tree, fuzz/, and runs every target for
  # TZ_FUZZ_SECONDS (6 by default), two at a time; skipped (77) without clang and libFuzzer.
  # ctest stops it after 30 minutes: for longer runs call tests/fuzz/fuzz_test.sh directly.
  add_test(NAME fuzz
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_test.sh ${CMAKE_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/fuzz ${TZ_FUZZ_TARGETS})
  set_tests_properties(fuzz PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1800 PROCESSORS 2
    ENVIRONMENT "${TZ_TEST_ENV}" LABELS "fuzz")
endif()
