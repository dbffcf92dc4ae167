# The guide's JSONL-to-adapter walk on the bundled example (prep jsonl, train, eval, generate).
add_test(NAME instruct_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/instruct/instruct_test.sh $<TARGET_FILE:turbozero>
    ${CMAKE_SOURCE_DIR})
set_tests_properties(instruct_end_to_end PROPERTIES TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
# generate in a chat template (--template, --chat, --stop, --interactive) and the checks of the
# data against the model before training (tokenizer digest, ids beyond the vocab, seq_len).
add_test(NAME instruct_chat_checks
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/instruct/chat_checks_test.sh $<TARGET_FILE:turbozero>
    ${CMAKE_SOURCE_DIR})
set_tests_properties(instruct_chat_checks PROPERTIES TIMEOUT 120
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
