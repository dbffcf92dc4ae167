# Tests that need a GPU (they skip, 77, without one or in a build without CUDA): label gpu,
# so `ctest -L gpu` on a GPU machine runs them (docs/gpu.md), and not quick.
set_tests_properties(test_cuda_ops test_gpu_model PROPERTIES LABELS "gpu;unit")
