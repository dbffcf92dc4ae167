#!/bin/bash
# Build the CUDA backend here and test it on a GPU machine that lacks the MPI/HDF5 stack
# (docs/gpu.md). Two steps, from the project root:
#
#   tests/gpu/device.sh pack    on the development machine: configures and builds build-cuda
#                               (-DTZ_CUDA=ON: fails when CUDA cannot be built), then fills
#                               .device/ (ignored by git) with the runtime packages, env.sh and
#                               the GPU test executables (the steps of the shared pack.sh,
#                               which also works in a git worktree here; TZ_DEVICE_KIT=folder
#                               of runtime-packages.txt and env.sh, default ../shared/device).
#   tests/gpu/device.sh run     on the GPU machine, with .device/ carried beside the tree:
#                               sources .device/env.sh, shows the GPU, runs every GPU test.
#                               Exit status: 0 all passed, 1 a failure, 77 no GPU visible.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${TZ_BUILD:-build-cuda}
tests=(test_cuda_ops) # the tests labelled gpu (tests/gpu.cmake)

case "${1:-}" in
pack)
  set -e
  cmake -S . -B "$build" -DTZ_CUDA=ON -DTZ_NATIVE=OFF >/dev/null
  targets=(turbozero tzcuda "${tests[@]}")
  cmake --build "$build" -j"${TZ_JOBS:-2}" --target "${targets[@]}"
  files=("$build/turbozero" "$build/libtzcuda.so") # the CUDA backend is a loaded module
  for t in "${tests[@]}"; do files+=("$build/tests/$t"); done
  kit=${TZ_DEVICE_KIT:-$root/../shared/device}
  mkdir -p .device/debs
  if [ -z "$(ls .device/debs/*.deb 2>/dev/null)" ]; then
    # shellcheck disable=SC2046
    (cd .device/debs && apt-get download $(cat "$kit/runtime-packages.txt") >/dev/null 2>&1) ||
      { apt-get update -qq && (cd .device/debs && apt-get download $(cat "$kit/runtime-packages.txt")); }
  fi
  cp "$kit/env.sh" .device/env.sh
  for f in "${files[@]}"; do mkdir -p ".device/$(dirname "$f")"; cp -a "$f" ".device/$f"; done
  du -sh .device | awk '{print ".device: " $1}'
  echo "now carry .device/ to the GPU machine and run: tests/gpu/device.sh run"
  ;;
run)
  [ -e .device/env.sh ] || { echo "no .device/env.sh: run 'tests/gpu/device.sh pack' first" >&2; exit 2; }
  # shellcheck disable=SC1091
  source .device/env.sh
  export TZ_CUDA_MODULE=$PWD/.device/$build/libtzcuda.so # beside turbozero; the tests' is here
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
  status=0 skipped=0
  for t in "${tests[@]}"; do
    exe=".device/$build/tests/$t"
    echo "== $t"
    "$exe"
    rc=$?
    if [ $rc -eq 77 ]; then skipped=1; echo "== $t: skipped (no GPU or no CUDA backend)"
    elif [ $rc -ne 0 ]; then status=1; echo "== $t: FAILED (exit $rc)"
    else echo "== $t: passed"; fi
  done
  [ $status -eq 0 ] && [ $skipped -eq 1 ] && exit 77
  exit $status
  ;;
*)
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
