#!/bin/sh
# Config error paths: runs tz_config_check (argument 1) on bad configs and bad --set values;
# each must exit non-zero with "FILE:LINE: section.key: ..." on stderr. Good input: test_config.
set -u
CHECK=${1:?usage: config_errors.sh PATH/TO/tz_config_check}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tzcfgerr.XXXXXX") || exit 1
pass=0
fail=0

# cfg NAME: writes stdin to $TMP/NAME.cfg and sets F to its path.
cfg() {
    F="$TMP/$1.cfg"
    cat >"$F"
}

# fails NAME PATTERN HINT FILE [SET...]: the loader must exit non-zero, stderr must hold
# PATTERN and, unless HINT is "", HINT too.
fails() {
    name=$1 pattern=$2 hint=$3 file=$4
    shift 4
    if "$CHECK" "$file" "$@" >"$TMP/out" 2>"$TMP/err"; then
        echo "FAIL $name: exited 0"
        fail=$((fail + 1))
        return
    fi
    for p in "$pattern" "$hint"; do
        if [ -n "$p" ] && ! grep -qF -- "$p" "$TMP/err"; then
            echo "FAIL $name: stderr lacks: $p"
            sed 's/^/    | /' "$TMP/err"
            fail=$((fail + 1))
            return
        fi
    done
    pass=$((pass + 1))
}

# works NAME FILE [SET...]: the loader must print OK.
works() {
    name=$1 file=$2
    shift 2
    if "$CHECK" "$file" "$@" >"$TMP/out" 2>"$TMP/err" && head -n1 "$TMP/out" | grep -qx OK; then
        pass=$((pass + 1))
    else
        echo "FAIL $name: did not load"
        sed 's/^/    | /' "$TMP/err"
        fail=$((fail + 1))
    fi
}

cfg good <<'EOF'
# a minimal good config
model = { path = "m"; };
EOF
GOOD=$F
works good "$GOOD"
works good_set "$GOOD" train.steps=5 lora.targets=q,v model.arch=dit

# ---- file: unknown names ----
cfg unknown_key <<'EOF'
model = { path = "m"; };
train = {
  micro_bach = 4;
};
EOF
fails unknown_key "$F:3: train.micro_bach: unknown key" "did you mean train.micro_batch?" "$F"

cfg key_wrong_section <<'EOF'
model = { path = "m"; };
train = { lr = 0.1; };
EOF
fails key_wrong_section "$F:2: train.lr: unknown key" "did you mean optim.lr?" "$F"

cfg unknown_section <<'EOF'
model = { path = "m"; };

trian = { steps = 1; };
EOF
fails unknown_section "$F:3: trian: unknown section" "did you mean train?" "$F"

cfg toplevel_scalar <<'EOF'
model = { path = "m"; };
train = 5;
EOF
fails toplevel_scalar "$F:2: train: expected a section" "" "$F"

# ---- file: wrong types ----
cfg string_for_int <<'EOF'
model = { path = "m"; };
train = { steps = "10"; };
EOF
fails string_for_int "$F:2: train.steps: expected an integer in 1..1000000000 (got a string" "" "$F"

cfg float_for_int <<'EOF'
model = { path = "m"; };
train = {
  steps = 100;
  micro_batch = 2.5;
};
EOF
fails float_for_int "$F:4: train.micro_batch: expected an integer in 1..65536 (got a float (2.5))" "" "$F"

cfg int_for_bool <<'EOF'
model = { path = "m"; };
train = { checkpointing = 1; };
EOF
fails int_for_bool "$F:2: train.checkpointing: expected a boolean (true or false) (got an integer (1))" \
    "HINT: write true or false" "$F"

cfg list_for_string <<'EOF'
model = { path = "m"; };
data = { train = ("a.bin"); };
EOF
fails list_for_string "$F:2: data.train: expected a string" "(got a list)" "$F"

cfg array_for_string <<'EOF'
model = { path = ["m"]; };
EOF
fails array_for_string "$F:1: model.path: expected a string" "(got an array)" "$F"

cfg bool_for_float <<'EOF'
model = { path = "m"; };
optim = { lr = true; };
EOF
fails bool_for_float "$F:2: optim.lr: expected a number in (0, 10] (got a boolean (true))" "" "$F"

cfg int_for_enum <<'EOF'
model = { path = "m"; arch = 1; };
EOF
fails int_for_enum "$F:1: model.arch: expected one of \"llama\", \"dit\", \"flux\" (got an integer (1))" "" "$F"

# ---- file: ranges ----
cfg int_range <<'EOF'
model = { path = "m"; };
data = { seq_len = 0; };
EOF
fails int_range "$F:2: data.seq_len: expected an integer in 1..65536 (got 0)" "" "$F"

cfg int_range_high <<'EOF'
model = { path = "m"; };
train = { threads = 4097; };
EOF
fails int_range_high "$F:2: train.threads: expected an integer in 0..4096 (got 4097)" "" "$F"

cfg int64_range <<'EOF'
model = { path = "m"; };
run = { seed = 4611686018427387905L; };
EOF
fails int64_range "$F:2: run.seed: expected an integer in 0..4611686018427387904 (got 4611686018427387905)" "" "$F"

cfg int64_negative <<'EOF'
model = { path = "m"; };
run = { seed = -1; };
EOF
fails int64_negative "$F:2: run.seed: expected an integer in 0..4611686018427387904 (got -1)" "" "$F"

cfg int_wraps <<'EOF'
model = { path = "m"; };
train = {
  steps =
    5000000000;
};
EOF
fails int_wraps "$F:3: train.steps: expected an integer that fits 32 bits or ends in L (got 5000000000)" "write 5000000000L" "$F"

cfg float_key_wraps <<'EOF'
model = { path = "m"; };
optim = { lr = 0.001; grad_clip = 5000000000; };
EOF
fails float_key_wraps "$F:2: optim.grad_clip: expected an integer that fits 32 bits" "write 5000000000L" "$F"

cfg float_open_low <<'EOF'
model = { path = "m"; };
optim = { lr = 0.0; };
EOF
fails float_open_low "$F:2: optim.lr: expected a number in (0, 10] (got 0)" "" "$F"

cfg float_open_high <<'EOF'
model = { path = "m"; };
optim = { beta1 = 1.0; };
EOF
fails float_open_high "$F:2: optim.beta1: expected a number in [0, 1) (got 1)" "" "$F"

cfg float_closed <<'EOF'
model = { path = "m"; };
optim = { grad_clip = -0.5; };
EOF
fails float_closed "$F:2: optim.grad_clip: expected a number in [0, 1e+06] (got -0.5)" "" "$F"

cfg float_inf <<'EOF'
model = { path = "m"; };
lora = { alpha = 1e400; };
EOF
fails float_inf "$F:2: lora.alpha: expected a number in (0, 1e+06] (got inf)" "" "$F"

# ---- file: enums and targets ----
cfg bad_enum <<'EOF'
model = { path = "m"; };
train = { mode = "qlora"; };
EOF
fails bad_enum "$F:2: train.mode: expected one of \"lora\", \"full\", \"qzo\" (got \"qlora\")" "" "$F"

cfg bad_target <<'EOF'
model = { path = "m"; };
lora = { targets = ["q",
                    "x"]; };
EOF
fails bad_target "$F:3: lora.targets: expected a non-empty list of names from \"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\", \"qkv\", \"proj\", \"fc1\", \"fc2\", \"adaln\", \"to_q\", \"to_k\", \"to_v\", \"to_out.0\", \"add_q_proj\", \"add_k_proj\", \"add_v_proj\", \"to_add_out\", \"ff.net.0.proj\", \"ff.net.2\", \"ff_context.net.0.proj\", \"ff_context.net.2\", \"norm1.linear\", \"norm1_context.linear\", \"proj_mlp\", \"proj_out\", \"norm.linear\" or \"all\" (or one name as a string) (got \"x\")" "" "$F"

cfg target_not_string <<'EOF'
model = { path = "m"; };
lora = { targets = ("q", 1); };
EOF
fails target_not_string "$F:2: lora.targets: expected a non-empty list" "(got an integer (1))" "$F"

cfg empty_targets <<'EOF'
model = { path = "m"; };
lora = { targets = []; };
EOF
fails empty_targets "$F:2: lora.targets: expected a non-empty list" "(got an empty list)" "$F"

# one name as a string is a list of one ("all", the default's spelling, or "q"); a wrong one
# is named
cfg targets_string <<'EOF'
model = { path = "m"; };
lora = { targets = "qq"; };
EOF
fails targets_string "$F:2: lora.targets: expected a non-empty list" "(got \"qq\")" "$F"

# ---- file: required, strings, syntax ----
cfg missing_path <<'EOF'
train = { steps = 5; };
EOF
fails missing_path "$F: model.path: required key missing" "--set model.path=" "$F"

cfg empty_path <<'EOF'
model = { path = ""; };
EOF
fails empty_path "$F:1: model.path: expected a string of at most 511 bytes (got an empty string)" "" "$F"

LONG=$(awk 'BEGIN { for (i = 0; i < 600; i++) printf "a" }')
cfg long_string <<EOF
model = { path = "m"; };
run = { dir = "$LONG"; };
EOF
fails long_string "$F:2: run.dir: expected a string of at most 511 bytes (got a string of 600 bytes)" "" "$F"

cfg syntax <<'EOF'
model = { path = "m"; };
# a comment
train = { steps = ; };
EOF
fails syntax "$F:3: syntax error" "" "$F"

cfg duplicate <<'EOF'
model = { path = "m"; };
train = { steps = 1;
  steps = 2; };
EOF
fails duplicate "$F:3: duplicate setting name" "" "$F"

fails no_file "$TMP/absent.cfg: cannot open" "" "$TMP/absent.cfg"

# ---- --set ----
fails set_unknown "--set train.stepz: unknown key" "did you mean train.steps?" "$GOOD" train.stepz=5
fails set_unknown_section "--set trian.steps: unknown key" "did you mean train.steps?" "$GOOD" trian.steps=5
fails set_unknown_far "--set lora.zzz: unknown key" "keys of lora: rank alpha targets" "$GOOD" lora.zzz=1
fails set_no_equals "--set train.steps: expected section.key=value" "" "$GOOD" train.steps
fails set_bad_int "--set train.steps=abc: expected an integer in 1..1000000000 (got \"abc\")" "" "$GOOD" train.steps=abc
fails set_float_for_int "--set train.steps=2.5: expected an integer" "" "$GOOD" train.steps=2.5
fails set_empty_int "--set train.steps=: expected an integer" "" "$GOOD" train.steps=
fails set_int_overflow "--set run.seed=99999999999999999999: expected an integer" "" "$GOOD" run.seed=99999999999999999999
fails set_bad_float "--set optim.lr=1e-3x: expected a number in (0, 10]" "" "$GOOD" optim.lr=1e-3x
fails set_nan "--set optim.lr=nan: expected a number in (0, 10] (got nan)" "" "$GOOD" optim.lr=nan
fails set_bad_bool "--set train.checkpointing=yes: expected a boolean (true or false)" "" "$GOOD" train.checkpointing=yes
fails set_int_for_bool "--set run.overwrite=1: expected a boolean (true or false)" \
    "HINT: write true or false" "$GOOD" run.overwrite=1
fails set_bad_enum "--set model.arch=gpt: expected one of \"llama\", \"dit\", \"flux\" (got \"gpt\")" "" "$GOOD" model.arch=gpt
fails set_bad_target "--set lora.targets=q,x: expected a non-empty list" "(got \"x\")" "$GOOD" lora.targets=q,x
fails set_empty_targets "--set lora.targets=: expected a non-empty list" "(got an empty list)" "$GOOD" lora.targets=
fails set_empty_target_name "--set lora.targets=q,,v: expected a non-empty list" "(got an empty name)" "$GOOD" lora.targets=q,,v
fails set_int_range "--set train.micro_batch=0: expected an integer in 1..65536 (got 0)" "" "$GOOD" train.micro_batch=0
fails set_int64_range "--set run.seed=-5: expected an integer in 0..4611686018427387904 (got -5)" "" "$GOOD" run.seed=-5
fails set_float_range "--set optim.beta2=1: expected a number in [0, 1) (got 1)" "" "$GOOD" optim.beta2=1
fails set_long_string "--set run.dir=" "(got a string of 600 bytes)" "$GOOD" "run.dir=$LONG"
fails set_empty_required "--set model.path=: expected a string" "(got an empty string)" "$GOOD" model.path=
fails set_bad_device "--set run.device=gpu: expected one of \"auto\", \"cpu\", \"cuda\" (got \"gpu\")" "" "$GOOD" run.device=gpu
fails set_bad_comm "--set comm.backend=gloo: expected one of \"auto\", \"mpi\", \"nccl\" (got \"gloo\")" "" "$GOOD" comm.backend=gloo
fails nccl_on_cpu "comm.backend = \"nccl\" needs GPU memory, but run.device = \"cpu\"" "set run.device = \"cuda\"" "$GOOD" comm.backend=nccl run.device=cpu
works nccl_on_auto "$GOOD" comm.backend=nccl run.device=auto
fails set_bad_precision "--set run.precision=fp16: expected one of \"auto\", \"fp32\", \"bf16\" (got \"fp16\")" "" "$GOOD" run.precision=fp16
# the file's own errors come before any --set
fails file_before_set "$TMP/unknown_key.cfg:3: train.micro_bach: unknown key" "" "$TMP/unknown_key.cfg" train.steps=5

echo "config_errors: $pass passed, $fail failed"
if [ "$fail" -eq 0 ]; then rm -rf "$TMP"; else echo "files kept in $TMP"; fi
[ "$fail" -eq 0 ]
