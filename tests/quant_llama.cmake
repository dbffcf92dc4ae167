# Quantized base weights end to end (tests/quant/): the quantize and export commands, the three
# ways to a quantized model agree, LoRA on a 4-bit base, error messages; and the quality table
# (TurboQuant vs absmax at 2-4 bits on the in-domain KJV text; skipped, 77, without its data).
add_test(NAME quant_llama_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant/quant_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
add_test(NAME quant_llama_quality
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant/quant_quality.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
# (They ran without OMP_WAIT_POLICY=PASSIVE once: sharing the cores, they took 13 minutes.)
set_tests_properties(quant_llama_end_to_end quant_llama_quality PROPERTIES TIMEOUT 900
  SKIP_RETURN_CODE 77 ENVIRONMENT "${TZ_TEST_ENV}")
set_tests_properties(quant_llama_end_to_end PROPERTIES LABELS "e2e")
set_tests_properties(quant_llama_quality PROPERTIES LABELS "quality")

# quant.rounding and quant.count_changes on a full fine-tune of a 3-bit base
# (tests/quant/rounding_test.sh).
add_test(NAME quant_rounding
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant/rounding_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(quant_rounding PROPERTIES TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e")
