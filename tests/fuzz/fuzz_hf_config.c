/* HF config.json (io/hf_config.c): the input is read as a Llama config.json; one that is
 * accepted is written back (tz_hf_llama_write) and must read back to the same values, and
 * the file is also read for its model_type and rewritten with a quantization_config. */
#include <math.h>

#include "fuzz_common.h"
#include "io/hf_config.h"

static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600], out[600], err[2048] = "", type[64];
    fz_file(path, "config.json", data, size);
    fz_path(out, "written.json");
    tz_hf_model_type(fz_dir(), type, sizeof type, err, sizeof err);
    tz_hf_config_rewrite(path, out, "{\"quant_method\": \"turboquant\", \"bits\": 4}", "bfloat16",
                         err, sizeof err);
    tz_hf_llama c, back;
    err[0] = 0;
    if (tz_hf_llama_read(&c, path, err, sizeof err)) {
        fz_rejected(err, path);
        return 0;
    }
    FZ_ASSERT(tz_hf_llama_write(&c, out, err, sizeof err) == 0, "an accepted config is not written: %s", err);
    FZ_ASSERT(tz_hf_llama_read(&back, out, err, sizeof err) == 0, "the written config is refused: %s", err);
    FZ_ASSERT(c.vocab_size == back.vocab_size && c.hidden_size == back.hidden_size &&
                  c.intermediate_size == back.intermediate_size &&
                  c.num_hidden_layers == back.num_hidden_layers &&
                  c.num_attention_heads == back.num_attention_heads &&
                  c.num_key_value_heads == back.num_key_value_heads && c.head_dim == back.head_dim &&
                  c.max_position_embeddings == back.max_position_embeddings &&
                  c.tie_word_embeddings == back.tie_word_embeddings,
              "sizes differ after a write and a read");
    FZ_ASSERT(same(c.rms_norm_eps, back.rms_norm_eps) && same(c.rope_theta, back.rope_theta),
              "rms_norm_eps %.17g -> %.17g, rope_theta %.17g -> %.17g", c.rms_norm_eps,
              back.rms_norm_eps, c.rope_theta, back.rope_theta);
    FZ_ASSERT(!strcmp(c.rope_type, back.rope_type) && same(c.rope_factor, back.rope_factor) &&
                  same(c.rope_low_freq_factor, back.rope_low_freq_factor) &&
                  same(c.rope_high_freq_factor, back.rope_high_freq_factor) &&
                  c.rope_original_max_position_embeddings ==
                      back.rope_original_max_position_embeddings,
              "rope_scaling differs after a write and a read");
    FZ_ASSERT(!strcmp(c.torch_dtype, back.torch_dtype), "torch_dtype \"%s\" -> \"%s\"",
              c.torch_dtype, back.torch_dtype);
    return 0;
}
