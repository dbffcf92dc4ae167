# train.mode = "qzo" end to end: the loss drops on the bundled 4-bit Llama, identical runs at
# N = 1, 2, 4 (Llama) and 1, 2 (DiT), the saved model, bench memory against LoRA and full,
# refused settings (tests/train/qzo_test.sh; the unit side is tests/unit/test_qzo.c).
add_test(NAME qzo_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/qzo_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(qzo_end_to_end PROPERTIES TIMEOUT 900
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e;mpi")
