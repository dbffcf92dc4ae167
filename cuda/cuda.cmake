# The CUDA backend (cuda/*.cu), included by the top-level CMakeLists.txt once the CUDA language
# is enabled: a loadable module, libtzcuda.so beside the turbozero binary, compiled by nvcc for
# CMAKE_CUDA_ARCHITECTURES (default 80;90: A100, H100/H200). backend/registry.c loads it (dlopen) only when
# a run may use a GPU, so the programs never link the CUDA runtime or cuBLAS: they start as
# fast as a CPU build (cuBLAS alone is half a gigabyte of libraries) and run on machines that
# have no CUDA libraries at all. The module calls back into the program (TZ_FATAL, the
# allocators, the TurboQuant tables), whose symbols the programs export (ENABLE_EXPORTS).
# (CMakeLists.txt found the toolkit and cuBLAS before enabling the language.)
find_package(CUDAToolkit REQUIRED)
add_library(tzcuda MODULE ${TZ_CUDA_SOURCES})
set_target_properties(tzcuda PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" POSITION_INDEPENDENT_CODE ON)
target_include_directories(tzcuda PRIVATE
  $<TARGET_PROPERTY:tzcore,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_definitions(tzcuda PRIVATE
  $<TARGET_PROPERTY:tzcore,INTERFACE_COMPILE_DEFINITIONS>)
# Warnings are errors here too (host code through the host compiler, device code by nvcc).
# No C++ runtime is linked: no exceptions, no RTTI.
target_compile_options(tzcuda PRIVATE -O3 --Werror=all-warnings
  -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter,-fno-exceptions,-fno-rtti)
target_link_libraries(tzcuda PRIVATE CUDA::cudart CUDA::cublas)
# backend/registry.c offers "cuda" (and "auto" may pick it) only in builds that have it, and
# finds the module beside the program or, for the tests, at its place in this build.
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/backend/registry.c APPEND PROPERTY COMPILE_DEFINITIONS
  TZ_HAVE_CUDA_BACKEND=1 TZ_CUDA_MODULE_BUILT="$<TARGET_FILE:tzcuda>")
target_link_libraries(tzcore PUBLIC ${CMAKE_DL_LIBS})
message(STATUS "turbozero: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
# The same sources emulated on the CPU, for the tests (tests/cuda_emu/emu/emu.cmake).
include(${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/emu.cmake)
