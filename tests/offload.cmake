# ZeRO stage 2 with the CUDA backend and the optimizer on the host (the offload path), against
# the CPU backend: comm mpi at N = 1, 2, nccl at N = 1, the comm choice (tests/offload).
# Skips (77) where run.device = "cuda" cannot be created: here without a GPU.
add_test(NAME offload_gpu
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/offload/offload_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(offload_gpu PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "gpu;mpi")
