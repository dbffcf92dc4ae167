"""Writes a small random Llama in HF layout whose sizes are awkward on purpose: vocab 97 and
MLP width 171 (odd), untied head, so no tensor is a multiple of the flat alignment (256)
and N = 3 divides nothing. usage: make_model.py DIR"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import st  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
V, C, F, L, H, KV = 97, 64, 171, 2, 4, 2
D = C // H
rng = np.random.default_rng(11)
w = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
for i in range(L):
    p = f"model.layers.{i}."
    w.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
              p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (KV * D, C),
              p + "self_attn.v_proj.weight": (KV * D, C), p + "self_attn.o_proj.weight": (C, H * D),
              p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
              p + "mlp.down_proj.weight": (C, F)})
tensors = {k: (np.ones(s) if len(s) == 1 else rng.normal(0, 0.05, s)).astype(np.float32) for k, s in w.items()}
st.save(os.path.join(out, "model.safetensors"), tensors)
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KV, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "max_position_embeddings": 256},
          open(os.path.join(out, "config.json"), "w"))
