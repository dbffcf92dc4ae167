"""Writes a tiny random model in the HF layout of Qwen2/Qwen2.5 (model_type "qwen2": biases on
q, k and v, tied embeddings as the small Qwen2.5 have) or Qwen3 ("qwen3": q_norm and k_norm
over each head, an explicit head_dim that is not hidden_size / num_attention_heads, untied),
written from the transformers configurations of those models, for the reference test.
Biases and norm weights are random, not HF's zeros and ones, so that a term left out shows.

usage: qwen_model.py OUT_DIR qwen2|qwen3 SEED"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


def main():
    out, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    assert arch in ("qwen2", "qwen3"), arch
    rng = np.random.default_rng(seed)
    V, C, F, L, H, KV = 97, 64, 96, 2, 4, 2
    D = 16 if arch == "qwen2" else 24
    tied = arch == "qwen2"
    cfg = {"architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "Qwen3ForCausalLM"],
           "model_type": arch, "vocab_size": V, "hidden_size": C, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": tied, "hidden_act": "silu", "use_sliding_window": False,
           "sliding_window": 64, "max_window_layers": L, "torch_dtype": "float32"}
    if arch == "qwen3":
        cfg["head_dim"] = D
        cfg["attention_bias"] = False

    def mat(*shape, s=0.08):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    W = {"model.embed_tokens.weight": mat(V, C, s=0.5), "model.norm.weight": 1 + mat(C, s=0.1)}
    if not tied:
        W["lm_head.weight"] = mat(V, C, s=0.2)
    for i in range(L):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = 1 + mat(C, s=0.1)
        W[p + "post_attention_layernorm.weight"] = 1 + mat(C, s=0.1)
        for name, o, n in (("q_proj", H * D, C), ("k_proj", KV * D, C), ("v_proj", KV * D, C),
                           ("o_proj", C, H * D)):
            W[p + f"self_attn.{name}.weight"] = mat(o, n)
            if arch == "qwen2" and name != "o_proj":
                W[p + f"self_attn.{name}.bias"] = mat(o, s=0.3)
        if arch == "qwen3":
            W[p + "self_attn.q_norm.weight"] = 1 + mat(D, s=0.2)
            W[p + "self_attn.k_norm.weight"] = 1 + mat(D, s=0.2)
        W[p + "mlp.gate_proj.weight"] = mat(F, C)
        W[p + "mlp.up_proj.weight"] = mat(F, C)
        W[p + "mlp.down_proj.weight"] = mat(C, F)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    st.save(os.path.join(out, "model.safetensors"), W)


if __name__ == "__main__":
    main()
