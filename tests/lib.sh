# Shared by the script tests (source it): the pass/fail tally with its closing line, and
# the timing-free view of metrics.jsonl used to compare two runs.
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
# metrics.jsonl without the fields that measure time: the speed, the wall-clock "time" of
# every record and the closing summary record (wall time, peak memory)
strip_timing() {
  sed -E -e '/^\{"summary": true/d' -e 's/, "[a-z]+_per_s": [0-9.]+, "step_s": [0-9.]+//' \
    -e 's/, "time": "[^"]*"//' "$1"
}
# same_run DIR_A DIR_B FILE: identical losses and a byte-identical output FILE
same_run() {
  [ -s "$1/metrics.jsonl" ] && diff <(strip_timing "$1/metrics.jsonl") <(strip_timing "$2/metrics.jsonl") > /dev/null &&
    cmp -s "$1/$3" "$2/$3"
}
# finish NAME: the closing "NAME: N passed, M failed" line and the exit status
finish() { echo "$1: $pass passed, $fail failed"; [ $fail -eq 0 ]; }
