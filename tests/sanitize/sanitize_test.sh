#!/usr/bin/env bash
# The sanitizer configuration (TZ_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer,
# portable CPU kernel, -O1) as part of the suite: configures and builds a second tree with
# only the unit test targets, and runs its unit tests. Any ASan report (out of bounds, use
# after free, a leak of ours) or UBSan report (which aborts: -fno-sanitize-recover) fails
# the test. OpenMPI's own leaks are suppressed by tests/sanitize/lsan.supp; its libraries
# have no frame pointers, so stacks are unwound slowly (fast_unwind_on_malloc=0) for the
# suppressions to see their frames. The op-case table (tests/ops/) runs once, on the CPU
# backend (its copies per CPU kernel would run the same portable kernel again). Then the
# program itself end to end, once: LoRA on the bundled model quantized at load to 4 bits, 2
# steps with a checkpoint after the first, evaluation before and after, the adapter saved (the
# path of a 4-bit LoRA run's config, data, quantization, checkpoint and output code, which
# the unit tests reach only in parts).
# usage: sanitize_test.sh SOURCE_DIR TREE
set -u
src=$1 tree=$2
# (not test_cuda_ops and test_gpu_model: without a CUDA backend in this tree they only skip)
names="$(cd "$src/tests/unit" && ls test_*.c | sed 's/\.c$//' |
  grep -vx 'test_cuda_ops\|test_gpu_model') test_op_table turbozero"
if ! cmake -S "$src" -B "$tree" -DTZ_SANITIZE=ON -DTZ_CUDA=OFF -DTZ_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release > "$tree.configure.log" 2>&1; then
  tail -20 "$tree.configure.log"; echo "FAIL configuring the sanitizer tree"; exit 1
fi
# shellcheck disable=SC2086
if ! cmake --build "$tree" -j "${TZ_SANITIZE_JOBS:-2}" --target $names > "$tree.build.log" 2>&1; then
  grep -E "error|Error" "$tree.build.log" | head -20; echo "FAIL building the sanitizer tree"; exit 1
fi
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$src/tests/sanitize/lsan.supp:print_suppressions=0
ctest --test-dir "$tree" -L unit -E '^op_table_cpu_|^test_cuda_ops$|^test_gpu_model$' -j "${TZ_SANITIZE_JOBS:-2}" --output-on-failure
rc=$?
run=$tree/e2e
rm -rf "$run"
if (cd "$src" && "$tree/turbozero" train inputs/llama/finetune.cfg --set quant.bits=4 \
      --set data.seq_len=32 --set train.micro_batch=2 --set train.steps=2 \
      --set train.checkpoint_every=1 --set train.eval_every=0 --set train.eval_windows=2 \
      --set train.log_every=1 --set train.threads=2 --set run.dir="$run") > "$run.log" 2>&1 &&
    grep -q "^saved .*adapter" "$run.log" && [ -f "$run/checkpoints/step-1/COMPLETE" ]; then
  echo "ok   turbozero train, 4-bit LoRA, 2 steps, checkpoints, eval, adapter: no sanitizer report"
else
  echo "FAIL turbozero train under the sanitizers (log: $run.log)"; tail -40 "$run.log"; rc=1
fi
exit $rc
