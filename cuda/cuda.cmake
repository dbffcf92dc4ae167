# The CUDA backend (cuda/*.cu), included by the top-level CMakeLists.txt once the CUDA language
# is enabled. One object library compiled by nvcc for CMAKE_CUDA_ARCHITECTURES (default 90:
# H100/H200), added to tzcore like the CPU kernels, so every program and test links it.
# (CMakeLists.txt found the toolkit and cuBLAS before enabling the language.)
find_package(CUDAToolkit REQUIRED)
add_library(tzcuda OBJECT ${TZ_CUDA_SOURCES})
target_include_directories(tzcuda PRIVATE
  $<TARGET_PROPERTY:tzcore,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_definitions(tzcuda PRIVATE
  $<TARGET_PROPERTY:tzcore,INTERFACE_COMPILE_DEFINITIONS>)
# Warnings are errors here too (host code through the host compiler, device code by nvcc).
# No C++ runtime is linked (the programs link as C): no exceptions, no RTTI.
target_compile_options(tzcuda PRIVATE -O3 --Werror=all-warnings
  -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter,-fno-exceptions,-fno-rtti)
target_link_libraries(tzcuda PRIVATE CUDA::cudart CUDA::cublas)
target_sources(tzcore PRIVATE $<TARGET_OBJECTS:tzcuda>)
set_target_properties(tzcore PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_link_libraries(tzcore PUBLIC CUDA::cudart CUDA::cublas)
# core/backend.c offers "cuda" (and "auto" may pick it) only in builds that have it.
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/core/backend.c APPEND PROPERTY COMPILE_DEFINITIONS
  TZ_HAVE_CUDA_BACKEND=1)
message(STATUS "turbozero: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
