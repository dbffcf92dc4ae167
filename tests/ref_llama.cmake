# Whole-model reference: turbozero's Llama loss and gradients against PyTorch (fp64) for tiny
# random models (GQA; tied and untied; LoRA and full; with and without checkpointing).
add_executable(tz_grad_dump ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_grad_dump.c)
target_compile_options(tz_grad_dump PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_grad_dump PRIVATE tzcore)
add_test(NAME ref_llama_vs_torch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ref/llama_ref.sh $<TARGET_FILE:turbozero>
          $<TARGET_FILE:tz_grad_dump> ${CMAKE_CURRENT_SOURCE_DIR}/ref)
set_tests_properties(ref_llama_vs_torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "reference")
