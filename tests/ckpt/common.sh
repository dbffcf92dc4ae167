# What the checkpoint tests share (source it after setting tz, src and py): the pass/fail
# tally (tests/lib.sh), mpirun as root and oversubscribed, and ckpt_setup TAG MICRO_BATCH:
# a scratch folder $work (removed at exit) with the ZeRO tests' awkward tiny Llama
# ($work/model), the mod-97 token file ($work/t97.tok) and $work/run.cfg: 6 steps of
# MICRO_BATCH windows, a checkpoint every 2 (steps 2 and 4), all kept; LoRA r3 on q, v, down;
# buckets of 0.004 MiB, so the plans of different N cut the tensors at different places.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset TZ_CKPT_FAULT
ckpt_setup() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  $py "$src/tests/zero/make_model.py" "$work/model" || exit 1
  $py "$src/tests/guard/tokens97.py" "$src/inputs/data/jargon.tok" "$work/t97.tok" || exit 1
  cat > "$work/run.cfg" <<CFG
model = { path = "$work/model"; };
data = { train = "$work/t97.tok"; seq_len = 32; };
train = { steps = 6; micro_batch = $2; grad_accum = 1; threads = 1; log_every = 6;
          checkpoint_every = 2; keep_checkpoints = 0; };
optim = { lr = 3e-3; warmup = 2; weight_decay = 0.1; };
lora = { rank = 3; alpha = 6.0; targets = ["q", "v", "down"]; };
zero = { bucket_mb = 0.004; };
CFG
}
