# lora.init = "loftq" (model/loftq.h): end to end over 1-3 MPI ranks, resume, eval of its
# adapter, refusals (tests/quant/loftq_test.sh); and its quality at 3 bits on the bundled model
# (tests/quant/loftq_quality.sh; skipped, 77, without the KJV text). The unit test is
# tests/unit/test_loftq.c.
add_test(NAME loftq_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant/loftq_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
add_test(NAME loftq_quality
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant/loftq_quality.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(loftq_end_to_end loftq_quality PROPERTIES TIMEOUT 600
  SKIP_RETURN_CODE 77 ENVIRONMENT "${TZ_TEST_ENV}")
set_tests_properties(loftq_end_to_end PROPERTIES LABELS "mpi")
set_tests_properties(loftq_quality PROPERTIES LABELS "quality")
