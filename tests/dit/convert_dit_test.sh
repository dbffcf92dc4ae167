#!/usr/bin/env bash
# tools/convert_dit.py on the layouts of docs/dit.md ("Parameter names and checkpoint
# conversion"), from the bundled DiT (inputs/dit/model: trained, so every weight is nonzero and
# a wrong mapping changes the loss; a fresh init-model DiT predicts exactly 0 whatever its
# other weights):
#  1. original DiT checkpoints: a plain state_dict .pt (with pos_embed) converts to the same
#     tensors bit for bit and the same config.json values; a training checkpoint
#     {"ema", "model"} converts its "ema" weights: a learn_sigma variant, no pos_embed
#     (--input-size);
#  2. diffusers folders built from the doc's table (per-block embedder copies, to_q/to_k/to_v
#     split): a pipeline folder with transformer/ in two shards and an index converts back bit
#     for bit (pos_embed recomputed as DiT computes it); a BF16 transformer folder reads
#     exactly, and --dtype bf16 writes the same BF16 bits back;
#  3. `turbozero eval` gives the same loss on the original folder and on each converted one
#     (on the learn_sigma variant too: the loss reads the first C channels);
#  4. bad input (a .pt without blocks.0.attn.qkv.weight, a diffusers folder without
#     config.json, an OUT_DIR not empty): a message naming the file, exit status 2.
# usage: convert_dit_test.sh TURBOZERO SOURCE_DIR
set -u
tz=$1 src=$2
py=/usr/bin/python3
if ! $py -c "import torch, numpy, h5py" 2> /dev/null; then
  echo "skipped: $py lacks torch, numpy or h5py" >&2
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tzditcvt.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$src"
tool=(env PYTHONDONTWRITEBYTECODE=1 $py tools/convert_dit.py)
base=inputs/dit/model

# the inputs: .pt files, diffusers folders, the learn_sigma reference folder, eval images
$py - "$base" "$work" <<'PY' || { bad "building the inputs"; finish dit_convert; exit 1; }
import json, os, shutil, struct, sys
import h5py, numpy as np, torch
sys.path.insert(0, "tests/ref")
import st
base, w = sys.argv[1], sys.argv[2]
A = st.load(base + "/model.safetensors")
cfg = json.load(open(base + "/config.json"))
D, C, p, L = cfg["hidden_size"], cfg["in_channels"], cfg["patch_size"], cfg["depth"]
T = lambda sd: {k: torch.from_numpy(v.copy()) for k, v in sd.items()}
torch.save(T(A), w + "/a.pt")
bad = dict(A)
del bad["blocks.0.attn.qkv.weight"]
torch.save(T(bad), w + "/bad.pt")

# learn_sigma: the final linear's outputs per token in (i, j, c) order, c < 2C; the first C
# channels are A's, the variance channels random
rng = np.random.default_rng(5)
S = dict(A)
for n in ("final_layer.linear.weight", "final_layer.linear.bias"):
    a = A[n].reshape(p * p, C, -1)
    v = rng.standard_normal(a.shape).astype(np.float32) * 0.05
    S[n] = np.concatenate([a, v], axis=1).reshape(p * p * 2 * C, *A[n].shape[1:])
os.makedirs(w + "/S")
st.save(w + "/S/model.safetensors", S)
json.dump(dict(cfg, learn_sigma=True), open(w + "/S/config.json", "w"), indent=2)
noise = {k: v + 1 for k, v in S.items() if k != "pos_embed"}
torch.save({"ema": T({k: v for k, v in S.items() if k != "pos_embed"}), "model": T(noise),
            "steps": 1234}, w + "/ckpt.pt")

def diffusers(sd):  # the doc's table, turbozero -> diffusers
    out = {"pos_embed.proj.weight": sd["x_embedder.proj.weight"],
           "pos_embed.proj.bias": sd["x_embedder.proj.bias"]}
    for x in ("weight", "bias"):
        for i in range(L):
            e, s, b = f"transformer_blocks.{i}.norm1.emb.", f"transformer_blocks.{i}.", f"blocks.{i}."
            out[e + "timestep_embedder.linear_1." + x] = sd["t_embedder.mlp.0." + x]
            out[e + "timestep_embedder.linear_2." + x] = sd["t_embedder.mlp.2." + x]
            out[s + "norm1.linear." + x] = sd[b + "adaLN_modulation.1." + x]
            for j, q in enumerate("qkv"):
                out[s + f"attn1.to_{q}." + x] = sd[b + "attn.qkv." + x][j * D:(j + 1) * D]
            out[s + "attn1.to_out.0." + x] = sd[b + "attn.proj." + x]
            out[s + "ff.net.0.proj." + x] = sd[b + "mlp.fc1." + x]
            out[s + "ff.net.2." + x] = sd[b + "mlp.fc2." + x]
        out["proj_out_1." + x] = sd["final_layer.adaLN_modulation.1." + x]
        out["proj_out_2." + x] = sd["final_layer.linear." + x]
    for i in range(L):
        out[f"transformer_blocks.{i}.norm1.emb.class_embedder.embedding_table.weight"] = \
            sd["y_embedder.embedding_table.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}

def save(path, tensors, bf16=False):  # safetensors, F32 or BF16 (truncated: exact bits kept)
    header, blobs, off = {}, [], 0
    for n in sorted(tensors):
        a = tensors[n]
        b = (a.view(np.uint32) >> 16).astype("<u2").tobytes() if bf16 else a.astype("<f4").tobytes()
        header[n] = {"dtype": "BF16" if bf16 else "F32", "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

dcfg = {"_class_name": "DiTTransformer2DModel", "_diffusers_version": "0.30.0",
        "num_attention_heads": cfg["num_heads"], "attention_head_dim": D // cfg["num_heads"],
        "in_channels": C, "out_channels": C, "num_layers": L, "dropout": 0.0,
        "norm_num_groups": 32, "attention_bias": True, "sample_size": cfg["input_size"],
        "patch_size": p, "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": cfg["num_classes"], "upcast_attention": False,
        "norm_type": "ada_norm_zero", "norm_elementwise_affine": False, "norm_eps": 1e-05}
# pipeline folder, transformer/ in two shards
tr = w + "/dA/transformer"
os.makedirs(tr)
json.dump({"_class_name": "DiTPipeline", "transformer": ["diffusers", "DiTTransformer2DModel"]},
          open(w + "/dA/model_index.json", "w"))
json.dump(dcfg, open(tr + "/config.json", "w"), indent=2)
dA = diffusers(A)
names = sorted(dA)
wm = {}
for k, part in enumerate((names[::2], names[1::2])):
    f = f"diffusion_pytorch_model-0000{k + 1}-of-00002.safetensors"
    save(tr + "/" + f, {n: dA[n] for n in part})
    wm.update({n: f for n in part})
json.dump({"metadata": {"total_size": sum(v.nbytes for v in dA.values())}, "weight_map": wm},
          open(tr + "/diffusion_pytorch_model.safetensors.index.json", "w"), indent=2)
# the transformer folder itself, learn_sigma, BF16 (S truncated to bf16)
Sb = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in S.items()}
Sb["pos_embed"] = S["pos_embed"]  # not stored by diffusers: recomputed in float32
os.makedirs(w + "/dS")
json.dump(dict(dcfg, out_channels=2 * C), open(w + "/dS/config.json", "w"), indent=2)
save(w + "/dS/diffusion_pytorch_model.safetensors", diffusers(Sb), bf16=True)
np.savez(w + "/Sb.npz", **Sb)
# a transformer folder without its config.json
os.makedirs(w + "/nocfg")
shutil.copy(tr + "/" + wm[names[0]], w + "/nocfg/")
# eval images
r = np.random.default_rng(1)
with h5py.File(w + "/val.h5", "w") as f:
    f["images"] = r.uniform(-1, 1, (48, C, cfg["input_size"], cfg["input_size"])).astype(np.float32)
    f["labels"] = r.integers(0, cfg["num_classes"], 48).astype(np.int64)
PY

convert() { # name (of its log), tool arguments...
  local name=$1; shift
  if "${tool[@]}" "$@" > "$work/$name.log" 2>&1; then return 0; fi
  bad "$name: convert_dit.py $* failed"; cat "$work/$name.log"; return 1
}
# same REF_MODEL REF_CONFIG OUT_DIR: OUT_DIR's tensors are REF_MODEL's bit for bit (the same
# names; REF_MODEL a safetensors file or a .npz), its config.json values REF_CONFIG's
same() {
  $py - "$@" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, "tests/ref")
import st
ref, rcfg, out = sys.argv[1:4]
want = dict(np.load(ref)) if ref.endswith(".npz") else st.load(ref)
got = st.load(out + "/model.safetensors")
assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
for k in want:
    assert got[k].dtype == np.float32 and got[k].shape == want[k].shape, (k, got[k].shape)
    assert np.array_equal(got[k].view(np.uint32), want[k].astype(np.float32).view(np.uint32)), k
c = json.load(open(out + "/config.json"))
r = json.load(open(rcfg))
assert c == r, (c, r)
PY
}
loss() { # the eval loss of a model folder
  printf 'model = { arch = "dit"; path = "%s"; };\ndata = { train = "%s"; val = "%s"; };\ntrain = { micro_batch = 48; threads = 1; eval_windows = 0; };\n' \
    "$1" "$work/val.h5" "$work/val.h5" > "$work/eval.cfg"
  "$tz" eval "$work/eval.cfg" 2>&1 | tail -1 | sed -n 's/^eval_loss=\([0-9.]*\) images=48$/\1/p'
}

ref=$(loss "$base") refS=$(loss "$work/S")
[ -n "$ref" ] && [ "$ref" = "$refS" ] && ok "eval: the bundled DiT $ref, its learn_sigma variant the same" ||
  bad "eval: the bundled DiT '$ref', its learn_sigma variant '$refS'"

# 1. original checkpoints (hidden 64 is no standard DiT width: --num-heads)
if convert a original "$work/a.pt" "$work/oA" --num-heads 4; then
  same $base/model.safetensors $base/config.json "$work/oA" &&
    ok "original .pt: the same tensors bit for bit (pos_embed kept), the same config.json values" ||
    bad "original .pt: tensors or config differ"
  l=$(loss "$work/oA")
  [ "$l" = "$ref" ] && ok "original .pt: eval loss $l, as the bundled folder's" || bad "original .pt: eval loss '$l' vs '$ref'"
fi
if convert ckpt original "$work/ckpt.pt" "$work/oS" --num-heads 4 --input-size 28; then
  grep -q '"ema" weights' "$work/ckpt.log" && $py - "$work/S/model.safetensors" "$work/oS" <<'PY' &&
import json, sys
import numpy as np
sys.path.insert(0, "tests/ref")
import st
want, got = st.load(sys.argv[1]), st.load(sys.argv[2] + "/model.safetensors")
assert sorted(got) == sorted(k for k in want if k != "pos_embed")
assert all(np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)) for k in got)
assert json.load(open(sys.argv[2] + "/config.json")) == json.load(open(sys.argv[1].rsplit("/", 1)[0] + "/config.json"))
PY
    ok "training checkpoint: its \"ema\" weights, learn_sigma inferred, bit for bit" ||
    { bad "training checkpoint {ema, model}: wrong weights or config"; cat "$work/ckpt.log"; }
  l=$(loss "$work/oS")
  [ "$l" = "$ref" ] && ok "training checkpoint (learn_sigma): eval loss $l" || bad "training checkpoint: eval loss '$l' vs '$ref'"
fi

# 2. diffusers
if convert dA diffusers "$work/dA" "$work/dA.out"; then
  same $base/model.safetensors $base/config.json "$work/dA.out" &&
    ok "diffusers pipeline, 2 shards: the original tensors bit for bit (pos_embed recomputed), the same config.json values" ||
    bad "diffusers pipeline: tensors or config differ"
  grep -q "downscale_freq_shift" "$work/dA.log" && ok "diffusers: the note on the timestep features" ||
    bad "diffusers: no note on the timestep features"
  l=$(loss "$work/dA.out")
  [ "$l" = "$ref" ] && ok "diffusers: eval loss $l" || bad "diffusers: eval loss '$l' vs '$ref'"
fi
if convert dS diffusers "$work/dS" "$work/dS.out" &&
   convert dSb diffusers "$work/dS" "$work/dS.bf16" --dtype bf16; then
  same "$work/Sb.npz" "$work/S/config.json" "$work/dS.out" &&
    ok "diffusers BF16, learn_sigma: read exactly (F32 out)" || bad "diffusers BF16: tensors or config differ"
  $py - "$work/dS/diffusion_pytorch_model.safetensors" "$work/dS.bf16/model.safetensors" <<'PY' &&
import json, struct, sys
def tensors(path):  # name -> (dtype, raw bytes)
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8:8 + n])
    return {k: (t["dtype"], data[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for k, t in h.items() if k != "__metadata__"}
src, out = tensors(sys.argv[1]), tensors(sys.argv[2])
assert all(d == "BF16" for d, _ in out.values())
assert out["x_embedder.proj.bias"][1] == src["pos_embed.proj.bias"][1]
assert out["blocks.1.mlp.fc2.weight"][1] == src["transformer_blocks.1.ff.net.2.weight"][1]
assert out["final_layer.linear.weight"][1] == src["proj_out_2.weight"][1]
PY
    ok "--dtype bf16: BF16 written, the source's bits unchanged" || bad "--dtype bf16: wrong dtype or bits"
  l=$(loss "$work/dS.out") lb=$(loss "$work/dS.bf16")
  [ -n "$l" ] && [ "$l" = "$lb" ] && awk -v a="$l" -v b="$ref" 'BEGIN {d = a - b; exit !(d < 0.01 && d > -0.01)}' &&
    ok "diffusers BF16: eval loss $l (F32 and BF16 folders), $ref in F32" ||
    bad "diffusers BF16: eval loss '$l' / '$lb' vs '$ref'"
fi

# 4. bad input
expect_bad() { # name, expected text, tool arguments...
  local name=$1 want=$2; shift 2
  "${tool[@]}" "$@" > "$work/err.log" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" "$work/err.log" && ! grep -q Traceback "$work/err.log"; then
    ok "$name: $(head -1 "$work/err.log")"
  else
    bad "$name: exit $rc, message lacks '$want'"; cat "$work/err.log"
  fi
}
expect_bad ".pt without blocks.0.attn.qkv.weight" "bad.pt: missing tensor \"blocks.0.attn.qkv.weight\"" \
  original "$work/bad.pt" "$work/e1" --num-heads 4
[ -e "$work/e1" ] && bad "a failed conversion left $work/e1" || ok "a failed conversion writes nothing"
expect_bad "diffusers folder without config.json" "nocfg: no config.json" diffusers "$work/nocfg" "$work/e2"
expect_bad "OUT_DIR not empty" "exists and is not empty (--force" diffusers "$work/dA" "$work/dA.out"
finish dit_convert
