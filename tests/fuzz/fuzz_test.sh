#!/usr/bin/env bash
# The fuzz targets (tests/fuzz.cmake) as part of the suite: configures and builds a second
# tree with TZ_FUZZ=ON (clang, libFuzzer, ASan + UBSan, the portable CPU kernel) holding only
# the fuzz targets, then for each target
#  1. replays every input in tests/fuzz/regress/TARGET/ (inputs that once failed: each must
#     now pass);
#  2. fuzzes it for TZ_FUZZ_SECONDS (6 by default) from its seeds, tests/fuzz/corpus/TARGET/,
#     with the dictionary tests/fuzz/dict/TARGET.dict where there is one, two targets at a
#     time (TZ_FUZZ_JOBS).
# Any sanitizer report (ASan, UBSan, a leak), abort, timeout (TZ_FUZZ_TIMEOUT seconds for one
# input, 10 by default) or out-of-memory fails the test, printing the report and the
# reproducer's path (run: TREE/tests/fuzz_TARGET REPRODUCER; keep it as
# tests/fuzz/regress/TARGET/NAME once fixed). An input the parser rejects with a message is
# not a failure. OpenMPI's own leaks are suppressed by tests/sanitize/lsan.supp, libconfig's
# by tests/fuzz/lsan.supp. Exit 77
# (skip), saying why, when clang, its libFuzzer runtime or its OpenMP runtime is missing.
# usage: fuzz_test.sh SOURCE_DIR TREE TARGET...   (TZ_FUZZ_CC: the compiler, clang by default)
set -u
src=$1 tree=$2
shift 2
targets=("$@")
secs=${TZ_FUZZ_SECONDS:-6} jobs=${TZ_FUZZ_JOBS:-2} cc=${TZ_FUZZ_CC:-clang}
per_input=${TZ_FUZZ_TIMEOUT:-10}
t0=$(date +%s)
mkdir -p "$tree"

# the tools
if ! command -v "$cc" > /dev/null; then
  echo "SKIP: no $cc in PATH: the fuzz targets need clang with libFuzzer (apt-get install clang libclang-rt-dev libomp-dev)"
  exit 77
fi
probe=$tree/probe
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n > 1 && d[0] == 1; }' > "$probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" > "$probe.log" 2>&1; then
  head -5 "$probe.log"
  echo "SKIP: $cc cannot link a libFuzzer target (-fsanitize=fuzzer): its runtime is missing (apt-get install libclang-rt-dev)"
  exit 77
fi
echo 'int main(void) { return 0; }' > "$probe.c"
if ! "$cc" -fopenmp "$probe.c" -o "$probe" > "$probe.log" 2>&1; then
  head -5 "$probe.log"
  echo "SKIP: $cc has no OpenMP runtime (-fopenmp), which the program needs (apt-get install libomp-dev)"
  exit 77
fi

# the tree
if ! CC=$cc cmake -S "$src" -B "$tree" -DTZ_FUZZ=ON -DTZ_CUDA=OFF -DTZ_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release > "$tree.configure.log" 2>&1; then
  tail -20 "$tree.configure.log"; echo "FAIL configuring the fuzz tree"; exit 1
fi
names=()
for t in "${targets[@]}"; do names+=("fuzz_$t"); done
if ! cmake --build "$tree" -j "$jobs" --target "${names[@]}" > "$tree.build.log" 2>&1; then
  grep -E "error|Error" "$tree.build.log" | head -20; echo "FAIL building the fuzz tree"; exit 1
fi
echo "built ${names[*]} in $(($(date +%s) - t0)) s"

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run=$tree/run
rm -rf "$run"
mkdir -p "$run/tmp"
cat "$src/tests/sanitize/lsan.supp" "$src/tests/fuzz/lsan.supp" > "$run/lsan.supp"
export LSAN_OPTIONS=suppressions=$run/lsan.supp:print_suppressions=0
export OMPI_MCA_mca_base_component_disable_dlclose=1
# the scratch files of the targets: in memory where there is a /dev/shm (prep fsyncs)
scratch=$run/tmp
if [ -d /dev/shm ] && [ -w /dev/shm ] && s=$(mktemp -d /dev/shm/tzfuzz.XXXXXX 2> /dev/null); then
  scratch=$s
  trap 'rm -rf "$scratch"' EXIT
fi
export TMPDIR=$scratch
failed=0

report() { # target, log, what
  echo "FAIL fuzz_$1: $3"
  grep -v -E '^(#[0-9]+\s+(NEW|REDUCE|pulse|INITED|DONE|RELOAD)|INFO:|Done )' "$2" | tail -60
  local a
  for a in "$run/artifacts/$1/"*; do
    [ -f "$a" ] || continue
    echo "   reproducer: $a  (run: $tree/tests/fuzz_$1 $a)"
    echo "   once fixed, keep it: cp $a $src/tests/fuzz/regress/$1/"
  done
  failed=1
}

# 1. the regression inputs
for t in "${targets[@]}"; do
  dir=$src/tests/fuzz/regress/$t
  files=()
  [ -d "$dir" ] && for f in "$dir"/*; do [ -f "$f" ] && files+=("$f"); done
  [ ${#files[@]} -eq 0 ] && continue
  log=$run/regress_$t.log
  if "$tree/tests/fuzz_$t" -timeout="$per_input" -error_exitcode=1 -timeout_exitcode=1 "${files[@]}" > "$log" 2>&1; then
    echo "ok   fuzz_$t: ${#files[@]} regression input(s) replayed, none fails"
  else
    echo "FAIL fuzz_$t: a regression input fails again"
    grep -E '^Running: ' "$log" | tail -1
    tail -40 "$log"
    failed=1
  fi
done

# 2. fuzzing, two targets at a time; new inputs go to a copy of each corpus, not the sources
fuzz_one() { # target
  local t=$1 corpus=$run/corpus/$1
  mkdir -p "$corpus" "$run/artifacts/$t"
  [ -d "$src/tests/fuzz/corpus/$t" ] && cp "$src/tests/fuzz/corpus/$t/"* "$corpus/" 2> /dev/null
  local dict=()
  [ -f "$src/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$src/tests/fuzz/dict/$t.dict")
  timeout -k 10 $((secs + 120)) "$tree/tests/fuzz_$t" "$corpus" "${dict[@]}" -max_total_time="$secs" \
    -timeout="$per_input" -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 \
    -artifact_prefix="$run/artifacts/$t/" -print_final_stats=1 > "$run/fuzz_$t.log" 2>&1
  echo $? > "$run/fuzz_$t.rc"
}
pending=("${targets[@]}")
while [ ${#pending[@]} -gt 0 ]; do
  batch=("${pending[@]:0:$jobs}")
  pending=("${pending[@]:$jobs}")
  for t in "${batch[@]}"; do fuzz_one "$t" & done
  wait
  for t in "${batch[@]}"; do
    log=$run/fuzz_$t.log rc=$(cat "$run/fuzz_$t.rc")
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    cov=$(grep -oE '^#[0-9]+.*(cov: [0-9]+)' "$log" | tail -1 | grep -oE 'cov: [0-9]+')
    if [ "$rc" = 0 ]; then
      echo "ok   fuzz_$t: ${execs:-?} inputs in ${secs} s, ${cov:-cov: ?}, corpus $(ls "$run/corpus/$t" | wc -l) inputs"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      report "$t" "$log" "did not finish in $((secs + 120)) s (a hang outside libFuzzer's timeout?)"
    else
      report "$t" "$log" "a crash, leak, undefined behaviour, timeout or out-of-memory (exit $rc)"
    fi
  done
done

echo "fuzz: ${#targets[@]} targets, $secs s each, $(($(date +%s) - t0)) s in all"
[ $failed = 0 ] || { echo "FAIL: see above (logs in $run)"; exit 1; }
echo "PASS"
