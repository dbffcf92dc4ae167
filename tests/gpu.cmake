# Tests that need a GPU (they skip, 77, without one or in a build without CUDA): label gpu,
# so `ctest -L gpu` on a GPU machine runs them (docs/gpu.md), and not quick.
set_tests_properties(test_cuda_ops test_gpu_model PROPERTIES LABELS "gpu;unit")
# The bundled LoRA job, 100 steps on the GPU against the same on the CPU (tests/gpu/lora_gpu.sh).
add_test(NAME gpu_lora_bundled
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu/lora_gpu.sh $<TARGET_FILE:turbozero>
          ${CMAKE_CURRENT_BINARY_DIR}/gpu_lora_bundled)
set_tests_properties(gpu_lora_bundled PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "gpu;e2e")
# bench --preset on the CPU: the 7B and XL/2 shapes planned (--dry-run) and refused, the
# CPU-sized presets run with the allocator's peak as planned (tests/gpu/bench_preset_test.sh).
add_test(NAME bench_preset
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu/bench_preset_test.sh $<TARGET_FILE:turbozero>
          ${CMAKE_CURRENT_BINARY_DIR}/bench_preset)
set_tests_properties(bench_preset PROPERTIES TIMEOUT 300 PROCESSORS 2
  ENVIRONMENT "${TZ_TEST_ENV}" LABELS "e2e;mpi")
# The same checks against the CPU emulation of the CUDA backend (tests/cuda_emu/emu/, label emu), where
# it is built: the whole models, and the device path of bench (extra synchronised steps for
# the split, cudaMemGetInfo) on the tiny preset.
if(TARGET tzcuda_emu)
  add_test(NAME test_gpu_model_emu COMMAND test_gpu_model WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  add_test(NAME bench_preset_emu
    COMMAND $<TARGET_FILE:turbozero> bench --preset llama-tiny --set run.device=cuda
            --set data.seq_len=32 --set train.micro_batch=2 --set train.steps=1)
  set_tests_properties(test_gpu_model_emu bench_preset_emu PROPERTIES TIMEOUT 300
    ENVIRONMENT "${TZ_TEST_ENV};TZ_CUDA_MODULE=$<TARGET_FILE:tzcuda_emu>" LABELS "emu")
  set_tests_properties(bench_preset_emu PROPERTIES PASS_REGULAR_EXPRESSION
    "GPU [0-9.]+ of [0-9.]+ GiB in use.*step split, mean of 2 extra steps: forward [0-9.]+ s")
endif()
# The GPU machine's scripts parse, and device.sh names its modes (a script broken here would
# cost a GPU lease to find): bash -n of both, then the usage (exit 2 without a mode).
add_test(NAME device_scripts
  COMMAND bash -c "bash -n '${CMAKE_CURRENT_SOURCE_DIR}/gpu/device.sh' && bash -n '${CMAKE_CURRENT_SOURCE_DIR}/gpu/ncu_top.sh' && { bash '${CMAKE_CURRENT_SOURCE_DIR}/gpu/device.sh'; test $? -eq 2; } 2>&1 && echo 'device scripts: parsed, usage with exit 2'")
# (the expression decides, not the exit status: the last line only when every step passed)
set_tests_properties(device_scripts PROPERTIES TIMEOUT 30 LABELS "unit"
  PASS_REGULAR_EXPRESSION "device.sh speed.*device.sh ab.*device.sh sweep.*device.sh ncu.*device.sh all.*device scripts: parsed, usage with exit 2")
