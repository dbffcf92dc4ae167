# Whole-model reference: turbozero's DiT (diffusion forward process, loss and every trainable
# gradient) against PyTorch (fp64) on tiny random models (LoRA and full, learn_sigma on and
# off, DDPM and flow, with and without checkpointing), and the samplers against fp64 Python.
add_executable(tz_dit_dump ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_dit_dump.c)
target_compile_options(tz_dit_dump PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_dit_dump PRIVATE tzcore)
add_test(NAME ref_dit_vs_torch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ref/dit_ref.sh $<TARGET_FILE:tz_dit_dump>
          ${CMAKE_CURRENT_SOURCE_DIR}/ref)
set_tests_properties(ref_dit_vs_torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "reference")

# Flux (MMDiT): the loss and every gradient of a small random model in the diffusers layout
# against an independent PyTorch implementation (tests/ref/flux_ref.py, fp64), with and
# without checkpointing.
add_executable(tz_flux_dump ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_flux_dump.c)
target_compile_options(tz_flux_dump PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_flux_dump PRIVATE tzcore)
add_test(NAME ref_flux_vs_torch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ref/flux_ref.sh $<TARGET_FILE:tz_flux_dump>
          ${CMAKE_CURRENT_SOURCE_DIR}/ref)
set_tests_properties(ref_flux_vs_torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "reference")
