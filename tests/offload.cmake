# ZeRO stage 2 with the CUDA backend and the optimizer on the host (the offload path), against
# the CPU backend: comm mpi at N = 1, 2, nccl at N = 1, the comm choice (tests/offload).
# Skips (77) where run.device = "cuda" cannot be created: here without a GPU.
add_test(NAME offload_gpu
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/offload/offload_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE})
set_tests_properties(offload_gpu PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "gpu;mpi")

# The same against the CPU emulation of the CUDA backend (tests/cuda_emu/emu), where it is built: the
# offload's copies, events and staging run here, without a GPU (label emu). comm nccl is not
# emulated (the script says so and goes on).
if(TARGET tzcuda_emu)
  add_test(NAME offload_emu
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/offload/offload_test.sh $<TARGET_FILE:turbozero>
            ${CMAKE_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} emu)
  set_tests_properties(offload_emu PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
    ENVIRONMENT "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>" LABELS "emu;mpi")
  add_test(NAME test_offload_ops_emu COMMAND test_offload_ops)
  set_tests_properties(test_offload_ops_emu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
    ENVIRONMENT "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>" LABELS "emu;unit")
endif()

# The NCCL comm's dlopen of libnccl.so.2 and its symbols, without a GPU (test_nccl_load):
# against the toolkit's NCCL where it has one (else skipped), and against an absent file.
if(TARGET tzcuda)
  set_tests_properties(test_nccl_load PROPERTIES ENVIRONMENT
    "${TZ_TEST_ENV};TZ_TEST_CUDA_MODULE=$<TARGET_FILE:tzcuda>;TZ_NCCL_LIBRARY=${CUDAToolkit_LIBRARY_DIR}/libnccl.so.2;TZ_TEST_NCCL_EXPECT=ok")
  add_test(NAME test_nccl_load_absent COMMAND test_nccl_load)
  set_tests_properties(test_nccl_load_absent PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60
    ENVIRONMENT "${TZ_TEST_ENV};TZ_TEST_CUDA_MODULE=$<TARGET_FILE:tzcuda>;TZ_NCCL_LIBRARY=/nonexistent/libnccl.so.2;TZ_TEST_NCCL_EXPECT=fail"
    LABELS "quick;unit")
endif()
