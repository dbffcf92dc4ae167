# The CPU emulation of the CUDA backend (tests/cuda_emu/emu/), included by cuda/cuda.cmake: the same
# cuda/*.cu and cuda/*.cuh, rewritten by tests/cuda_emu/emu/rewrite.py (kernel launches into calls of
# the emulated launcher) and compiled by the host C++ compiler against tests/cuda_emu/emu/include (an
# emulated CUDA runtime, cuBLAS and bf16), into a second module, libtzcuda_emu.so. Loaded with
# TZ_CUDA_MODULE=<build>/libtzcuda_emu.so, it runs the backend's own host code and kernels on
# the CPU, so the tests exercise them where there is no GPU (tests/cuda_emu.cmake). A
# correctness tool: its device calls itself a CPU emulation, never a GPU.
# NCCL (cuda/*nccl*.cu) is left out: the emulation has no NCCL (tests/cuda_emu/emu/include/nccl.h, a
# stub whose every call reports it unavailable, lets other sources include <nccl.h>).
option(TZ_CUDA_EMU "build libtzcuda_emu.so, the CUDA backend emulated on the CPU, for tests" ON)
if(TZ_CUDA_EMU AND TZ_SANITIZE)
  # its threads switch stacks, which AddressSanitizer cannot follow without annotations
  message(STATUS "turbozero: CUDA emulation not built under TZ_SANITIZE")
elseif(TZ_CUDA_EMU)
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    message(STATUS "turbozero: CUDA emulation not built: no python3 to rewrite the sources")
  else()
    enable_language(CXX)
    set(TZ_EMU_DIR ${CMAKE_BINARY_DIR}/cuda_emu)
    file(GLOB TZ_CUDA_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/cuda/*.cuh)
    set(TZ_EMU_GENERATED)
    # tz_emu_rewrite(SRC OUT): OUT is SRC rewritten for the emulation (a build step).
    function(tz_emu_rewrite src out)
      get_filename_component(dir ${out} DIRECTORY)
      get_filename_component(name ${src} NAME)
      add_custom_command(OUTPUT ${out}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
        COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/rewrite.py ${src} ${out}
        DEPENDS ${src} ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/rewrite.py
        COMMENT "Rewriting ${name} for the CUDA emulation" VERBATIM)
    endfunction()
    # The flags of everything compiled against the emulation: the real module's warnings
    # (-Wno-unused-parameter: kernels and table entries keep the parameters of their
    # interface); -O1: the kernels run briefly in tests and a shorter build matters more;
    # -ffp-contract=off: no fused multiply-add the source did not ask for, on any host CPU;
    # no C++ exceptions or RTTI, as in the real module.
    set(TZ_EMU_FLAGS -O1 -Wall -Wextra -Werror -Wno-unused-parameter -ffp-contract=off
      -fno-exceptions -fno-rtti)
    foreach(src ${TZ_CUDA_SOURCES} ${TZ_CUDA_HEADERS})
      get_filename_component(name ${src} NAME)
      if(name MATCHES "nccl")
        continue()
      endif()
      string(REGEX REPLACE "\\.cu$" ".cpp" out ${name})
      tz_emu_rewrite(${src} ${TZ_EMU_DIR}/cuda/${out})
      list(APPEND TZ_EMU_GENERATED ${TZ_EMU_DIR}/cuda/${out})
    endforeach()
    # The emulated runtime and cuBLAS, shared by the module and the emulation's own test
    # (tests/cuda_emu.cmake). They export nothing: the module's two entry points come from
    # cuda/cuda_backend.cu.
    add_library(tzcuda_emu_rt OBJECT ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/emu_runtime.cpp
      ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/emu_cublas.cpp)
    set_target_properties(tzcuda_emu_rt PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
      CXX_EXTENSIONS OFF POSITION_INDEPENDENT_CODE ON CXX_VISIBILITY_PRESET hidden)
    target_include_directories(tzcuda_emu_rt PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/include)
    target_compile_options(tzcuda_emu_rt PRIVATE ${TZ_EMU_FLAGS})
    add_library(tzcuda_emu MODULE ${TZ_EMU_GENERATED} $<TARGET_OBJECTS:tzcuda_emu_rt>)
    set_target_properties(tzcuda_emu PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
      CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
      POSITION_INDEPENDENT_CODE ON)
    # The emulated headers first, then the rewritten cuda/ (for "cuda/cuda_internal.cuh"),
    # then what the real module sees.
    target_include_directories(tzcuda_emu BEFORE PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu/include
      ${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu ${TZ_EMU_DIR})
    target_include_directories(tzcuda_emu PRIVATE
      $<TARGET_PROPERTY:tzcore,INTERFACE_INCLUDE_DIRECTORIES>)
    target_compile_definitions(tzcuda_emu PRIVATE
      $<TARGET_PROPERTY:tzcore,INTERFACE_COMPILE_DEFINITIONS>)
    target_compile_options(tzcuda_emu PRIVATE ${TZ_EMU_FLAGS})
    target_link_libraries(tzcuda_emu PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
    message(STATUS "turbozero: CUDA emulation (libtzcuda_emu.so) built for the tests")
  endif()
endif()
