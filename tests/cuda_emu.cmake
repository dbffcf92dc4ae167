# The CUDA backend's own code run on the CPU (tests/cuda_emu/emu/: libtzcuda_emu.so, built with the CUDA
# backend): every CUDA op against the CPU op (test_cuda_ops, loading the emulated module), in
# the two thread orders of the emulation (ascending and descending: a missing barrier shows in
# one or the other; the descending run does cp.async copies at their issue, the ascending at
# their wait, the two ends of when a GPU may do them), the op-case table in the forward order with every op called
# (cuda_op_coverage; the reverse order is op_table_emu_reverse, tests/ops.cmake), and short
# trainings and `generate` on the emulated device against the CPU's (tests/cuda_emu/train_emu.sh,
# generate_emu.sh). Not a GPU
# result: see docs/gpu.md for what this proves.
if(TARGET tzcuda_emu)
  foreach(order forward reverse)
    set(name cuda_ops_emu)
    set(async late)
    if(order STREQUAL "reverse")
      set(name cuda_ops_emu_reverse)
      set(async early)
    endif()
    # no SKIP_RETURN_CODE: test_cuda_ops skipping (77) here means the module did not load
    add_test(NAME ${name} COMMAND test_cuda_ops WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "emu;unit" ENVIRONMENT
      "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>;TZ_CUDA_EMU_ORDER=${order};TZ_CUDA_EMU_ASYNC=${async}")
  endforeach()
  add_test(NAME cuda_op_coverage
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu/op_coverage.sh $<TARGET_FILE:test_op_table>
            ${CMAKE_SOURCE_DIR}/src/core/backend.h $<TARGET_FILE:tzcuda_emu>)
  set_tests_properties(cuda_op_coverage PROPERTIES TIMEOUT 300 LABELS "emu;unit"
    ENVIRONMENT "${TZ_TEST_ENV}")
  add_test(NAME generate_cuda_emu
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu/generate_emu.sh $<TARGET_FILE:turbozero>
            ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tzcuda_emu>)
  set_tests_properties(generate_cuda_emu PROPERTIES TIMEOUT 300 LABELS "emu;e2e"
    ENVIRONMENT "${TZ_TEST_ENV}")
  add_test(NAME train_cuda_emu
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu/train_emu.sh $<TARGET_FILE:turbozero>
            ${CMAKE_SOURCE_DIR} $<TARGET_FILE:tzcuda_emu>)
  set_tests_properties(train_cuda_emu PROPERTIES TIMEOUT 600 LABELS "emu;unit"
    ENVIRONMENT "${TZ_TEST_ENV}")
endif()
# The emulation itself against CUDA's rules (tests/cuda_emu/emu_selftest.cu, built like the
# backend's sources): shuffles, barriers, memory checks, cuBLAS, and misuses reported by name.
if(TARGET tzcuda_emu_rt)
  tz_emu_rewrite(${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu/emu_selftest.cu
    ${CMAKE_BINARY_DIR}/cuda_emu/tests/emu_selftest.cpp)
  # (with the rewritten cuda/cuda_mma.cuh, whose warp-level product it checks)
  add_executable(test_cuda_emu ${CMAKE_BINARY_DIR}/cuda_emu/tests/emu_selftest.cpp
    ${TZ_EMU_DIR}/cuda/cuda_mma.cuh $<TARGET_OBJECTS:tzcuda_emu_rt>)
  set_target_properties(test_cuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF)
  target_include_directories(test_cuda_emu PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/include
    ${TZ_EMU_DIR})
  target_compile_options(test_cuda_emu PRIVATE ${TZ_EMU_FLAGS})
  target_link_libraries(test_cuda_emu PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
  # (the module's target owns the rewrite of cuda/*.cuh: built first, so that building this
  # target alone after a header's change does not compile a stale rewrite)
  add_dependencies(test_cuda_emu tzcuda_emu)
  add_test(NAME test_cuda_emu COMMAND test_cuda_emu)
  set_tests_properties(test_cuda_emu PROPERTIES TIMEOUT 120 LABELS "emu;unit")
endif()
