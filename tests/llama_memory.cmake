# test_llama_memory's device cases (the saved residual streams in host memory, the MLP in
# chunks) on the CPU emulation of the CUDA backend (tests/cuda_emu/emu/), where it is built.
if(TARGET tzcuda_emu)
  add_test(NAME test_llama_memory_emu COMMAND test_llama_memory
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_llama_memory_emu PROPERTIES TIMEOUT 300
    ENVIRONMENT "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>" LABELS "emu;unit")
endif()
