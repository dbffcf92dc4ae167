# The Flux family end to end on the CPU (tests/flux/flux_test.sh): a tiny model from
# init-model, cached latents, LoRA (one and two ranks, a 4-bit base), full fine-tuning,
# refused caches. The reference against PyTorch is ref_flux_vs_torch (tests/ref_dit.cmake).
add_test(NAME flux_end_to_end
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/flux/flux_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(flux_end_to_end PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e;mpi")
