# The op-case table (tests/ops/, op_case.h): one list of op cases, each op's forward against
# an fp64 reference and its backward against central differences, run on the CPU under each
# kernel built in (op_table_cpu, op_table_cpu_KERNEL), on the CUDA module's CPU emulation
# (cuda_op_coverage, op_table_emu_reverse: its two thread orders) and on a GPU (op_table_cuda,
# skipped without one). A row names the ops it calls; an op of the backend table that no row
# names fails every run.
file(GLOB TZ_OP_CASES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ops/*.c)
add_executable(test_op_table ${TZ_OP_CASES})
target_include_directories(test_op_table PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
  ${CMAKE_CURRENT_SOURCE_DIR}/unit)
target_compile_options(test_op_table PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(test_op_table PRIVATE tzcore)
add_test(NAME op_table_cpu COMMAND test_op_table cpu)
set_tests_properties(op_table_cpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick;unit")
if(NOT TZ_NATIVE)
  foreach(k ${TZ_CPU_KERNELS})
    add_test(NAME op_table_cpu_${k} COMMAND test_op_table cpu)
    set_tests_properties(op_table_cpu_${k} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
      ENVIRONMENT "${TZ_TEST_ENV};TZ_CPU_KERNEL=${k}" LABELS "unit")
  endforeach()
endif()
# On the emulation: the reverse thread order here; the forward order is cuda_op_coverage
# (tests/cuda_emu.cmake), which runs the table and also checks that every op was called.
if(TARGET tzcuda_emu)
  # no SKIP_RETURN_CODE: a skip (77) here means the emulated module did not load
  add_test(NAME op_table_emu_reverse COMMAND test_op_table cuda)
  set_tests_properties(op_table_emu_reverse PROPERTIES TIMEOUT 600 LABELS "emu;unit" ENVIRONMENT
    "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>;TZ_CUDA_EMU_ORDER=reverse;TZ_CUDA_EMU_ASYNC=early")
endif()
add_test(NAME op_table_cuda COMMAND test_op_table cuda)
set_tests_properties(op_table_cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "gpu")
