/* HF Llama config.json: defaults, a full file, write -> read round trip, and one rejected
 * file per rule, each message checked for the file and the key. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/hf_config.h"
#include "tz_check.h"



#define TMP "hf_tmp"

/* A reader that waits on a FIFO instead of refusing it fails the test (no hang). */
static void on_alarm(int sig) {
    static const char m[] = "FAIL a FIFO was waited on: no error within 20 s\n";
    (void)sig;
    if (write(1, m, sizeof m - 1) < 0) _exit(2);
    _exit(1);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static const char *g_req[5][2] = {
    {"vocab_size", "32000"},      {"hidden_size", "4096"},        {"intermediate_size", "11008"},
    {"num_hidden_layers", "32"},  {"num_attention_heads", "32"},
};

/* Writes TMP/name: the five required keys, with key=value overrides (value NULL removes the
 * key, a new key is appended). */
static const char *make_cfg(const char *name, const char *key, const char *value,
                            const char *key2, const char *value2) {
    static char path[256];
    char buf[2048];
    size_t at = (size_t)snprintf(buf, sizeof buf, "{");
    int first = 1, used1 = 0, used2 = 0;
    for (int i = 0; i < 5; i++) {
        const char *v = g_req[i][1];
        if (key && strcmp(key, g_req[i][0]) == 0) v = value, used1 = 1;
        if (key2 && strcmp(key2, g_req[i][0]) == 0) v = value2, used2 = 1;
        if (!v) continue;
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s\n  \"%s\": %s", first ? "" : ",",
                               g_req[i][0], v);
        first = 0;
    }
    if (key && !used1 && value)
        at += (size_t)snprintf(buf + at, sizeof buf - at, ",\n  \"%s\": %s", key, value);
    if (key2 && !used2 && value2)
        at += (size_t)snprintf(buf + at, sizeof buf - at, ",\n  \"%s\": %s", key2, value2);
    snprintf(buf + at, sizeof buf - at, "\n}\n");
    snprintf(path, sizeof path, TMP "/%s.json", name);
    write_text(path, buf);
    return path;
}

static void expect_reject(const char *what, const char *path, const char *s1, const char *s2) {
    tz_hf_llama c;
    char err[512] = "";
    int rc = tz_hf_llama_read(&c, path, err, sizeof err);
    int ok = rc != 0 && (!s1 || strstr(err, s1)) && (!s2 || strstr(err, s2));
    check(ok, "reject %-30s -> %s", what, rc ? err : "(accepted!)");
}

static void test_good(void) {
    tz_hf_llama c;
    char err[512];
    int rc = tz_hf_llama_read(&c, make_cfg("minimal", NULL, NULL, NULL, NULL), err, sizeof err);
    check(rc == 0 && c.vocab_size == 32000 && c.hidden_size == 4096 &&
              c.intermediate_size == 11008 && c.num_hidden_layers == 32 &&
              c.num_attention_heads == 32 && c.num_key_value_heads == 32 && c.head_dim == 128 &&
              c.max_position_embeddings == 2048 && c.rms_norm_eps == 1e-6 &&
              c.rope_theta == 10000.0 && c.tie_word_embeddings == 0 &&
              strcmp(c.model_type, "llama") == 0 && c.torch_dtype[0] == '\0',
          "minimal config: HF defaults applied%s%s", rc ? ": " : "", rc ? err : "");

    mkdir(TMP "/model", 0755);
    write_text(TMP "/model/config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,\n"
               " \"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": "
               "[128001, 128008], \"head_dim\": 64, \"hidden_act\": \"silu\",\n"
               " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,\n"
               " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": "
               "\"llama\",\n \"num_attention_heads\": 32, \"num_hidden_layers\": 16, "
               "\"num_key_value_heads\": 8,\n \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
               "\"rope_scaling\": null, \"rope_theta\": 500000.0,\n \"tie_word_embeddings\": true, "
               "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0\",\n"
               " \"use_cache\": true, \"vocab_size\": 128256}\n");
    rc = tz_hf_llama_read(&c, TMP "/model", err, sizeof err);
    check(rc == 0 && c.vocab_size == 128256 && c.hidden_size == 2048 && c.head_dim == 64 &&
              c.num_key_value_heads == 8 && c.num_hidden_layers == 16 &&
              c.max_position_embeddings == 131072 && c.rms_norm_eps == 1e-5 &&
              c.rope_theta == 500000.0 && c.tie_word_embeddings == 1 &&
              strcmp(c.torch_dtype, "bfloat16") == 0,
          "full Llama-3.2-style config read through its folder%s%s", rc ? ": " : "",
          rc ? err : "");

    rc = tz_hf_llama_read(&c, make_cfg("nulls", "head_dim", "null", "num_key_value_heads", "null"),
                          err, sizeof err);
    check(rc == 0 && c.head_dim == 128 && c.num_key_value_heads == 32,
          "null head_dim / num_key_value_heads mean the default");
    rc = tz_hf_llama_read(&c, make_cfg("llama31", "rope_scaling",
                                       "{\"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                       "\"high_freq_factor\": 4.0, "
                                       "\"original_max_position_embeddings\": 8192, "
                                       "\"rope_type\": \"llama3\"}", NULL, NULL),
                          err, sizeof err);
    check(rc == 0 && !strcmp(c.rope_type, "llama3") && c.rope_factor == 8.0 &&
              c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0 &&
              c.rope_original_max_position_embeddings == 8192,
          "Llama 3.1 rope_scaling (llama3) read%s%s", rc ? ": " : "", rc ? err : "");
    rc = tz_hf_llama_read(&c, make_cfg("ropedefault", "rope_scaling",
                                       "{\"rope_type\": \"default\"}", NULL, NULL),
                          err, sizeof err);
    check(rc == 0 && c.rope_type[0] == 0, "rope_scaling of type default means none");
    rc = tz_hf_llama_read(&c, make_cfg("mistral", "model_type", "\"mistral\"", "sliding_window",
                                       "null"), err, sizeof err);
    check(rc == 0 && !strcmp(c.model_type, "mistral"),
          "Mistral config without a sliding window read%s%s", rc ? ": " : "", rc ? err : "");
    rc = tz_hf_llama_read(&c, make_cfg("qwen2", "model_type", "\"qwen2\"", "sliding_window",
                                       "64"), err, sizeof err);
    check(rc == 0 && !strcmp(c.model_type, "qwen2"),
          "Qwen2 config read: its sliding_window ignored without "
          "use_sliding_window%s%s", rc ? ": " : "", rc ? err : "");
    rc = tz_hf_llama_read(&c, make_cfg("qwen3", "model_type", "\"qwen3\"", "head_dim", "24"),
                          err, sizeof err);
    check(rc == 0 && !strcmp(c.model_type, "qwen3") && c.head_dim == 24,
          "Qwen3 config read with an explicit head_dim%s%s", rc ? ": " : "",
          rc ? err : "");
    rc = tz_hf_llama_read(&c, make_cfg("dtype_new", "dtype", "\"float16\"", "rope_theta", "10000"),
                          err, sizeof err);
    check(rc == 0 && strcmp(c.torch_dtype, "float16") == 0 && c.rope_theta == 10000.0,
          "\"dtype\" (new spelling) read; integer rope_theta accepted");
}

static void test_write(void) {
    tz_hf_llama c, d;
    char err[512];
    tz_hf_llama_defaults(&c);
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.head_dim = 64;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1.2345678901234567e-7;
    c.rope_theta = 100000.0;
    c.tie_word_embeddings = 1;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "bfloat16");
    snprintf(c.rope_type, sizeof c.rope_type, "llama3");
    c.rope_factor = 32.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position_embeddings = 8192;
    int rc = tz_hf_llama_write(&c, TMP "/out_config.json", err, sizeof err);
    struct stat sb;
    check(rc == 0 && stat(TMP "/out_config.json.tmp", &sb) != 0, "writer writes, no .tmp left%s%s",
          rc ? ": " : "", rc ? err : "");
    rc = tz_hf_llama_read(&d, TMP "/out_config.json", err, sizeof err);
    check(rc == 0 && memcmp(&c, &d, sizeof c) == 0,
          "write -> read gives the same struct (doubles exact)%s%s", rc ? ": " : "",
          rc ? err : "");
    FILE *f = fopen(TMP "/out_config.json", "r");
    char text[4096] = "";
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    const char *keys[] = {"\"architectures\": [\"LlamaForCausalLM\"]", "\"model_type\": \"llama\"",
                          "\"hidden_act\": \"silu\"", "\"rope_scaling\": {\"rope_type\": \"llama3\"",
                          "\"attention_bias\": false", "\"mlp_bias\": false",
                          "\"torch_dtype\": \"bfloat16\"", "\"rope_theta\": 100000.0,",
                          "\"tie_word_embeddings\": true", "\"bos_token_id\": null"};
    int has = 1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) has &= strstr(text, keys[i]) != NULL;
    check(has, "written file has the keys transformers needs");

    /* Qwen3 keeps its type and architecture (its q_norm and k_norm need them) */
    tz_hf_llama q = c;
    snprintf(q.model_type, sizeof q.model_type, "qwen3");
    rc = tz_hf_llama_write(&q, TMP "/out_qwen3.json", err, sizeof err);
    rc |= tz_hf_llama_read(&d, TMP "/out_qwen3.json", err, sizeof err);
    f = fopen(TMP "/out_qwen3.json", "r");
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    check(rc == 0 && memcmp(&q, &d, sizeof q) == 0 &&
              strstr(text, "\"architectures\": [\"Qwen3ForCausalLM\"]") &&
              strstr(text, "\"model_type\": \"qwen3\"") &&
              strstr(text, "\"use_sliding_window\": false"),
          "Qwen3 written as Qwen3ForCausalLM, read back the same%s%s", rc ? ": " : "",
          rc ? err : "");

    memset(c.torch_dtype, 0, sizeof c.torch_dtype);
    c.tie_word_embeddings = 0;
    rc = tz_hf_llama_write(&c, TMP "/out_config.json", err, sizeof err);
    rc |= tz_hf_llama_read(&d, TMP "/out_config.json", err, sizeof err);
    check(rc == 0 && memcmp(&c, &d, sizeof c) == 0, "empty torch_dtype written as null, read back");

    c.num_key_value_heads = 4; /* 9 heads are not a multiple of 4 */
    rc = tz_hf_llama_write(&c, TMP "/bad_out.json", err, sizeof err);
    check(rc && strstr(err, "num_key_value_heads") && stat(TMP "/bad_out.json", &sb) != 0,
          "writer refuses an inconsistent config, writes nothing -> %s", err);
}

static void test_bad(void) {
    char name[64];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "missing_%s", g_req[i][0]);
        char what[64];
        snprintf(what, sizeof what, "missing %s", g_req[i][0]);
        expect_reject(what, make_cfg(name, g_req[i][0], NULL, NULL, NULL), name, g_req[i][0]);
    }
    const struct {
        const char *what, *key, *value, *key2, *value2, *expect;
    } cases[] = {
        {"hidden_size a string", "hidden_size", "\"4096\"", NULL, NULL, "\"hidden_size\""},
        {"hidden_size a real", "hidden_size", "4096.0", NULL, NULL, "\"hidden_size\""},
        {"num_key_value_heads a string", "num_key_value_heads", "\"8\"", NULL, NULL,
         "\"num_key_value_heads\""},
        {"rms_norm_eps a string", "rms_norm_eps", "\"1e-5\"", NULL, NULL, "\"rms_norm_eps\""},
        {"rope_theta null", "rope_theta", "null", NULL, NULL, "\"rope_theta\""},
        {"tie_word_embeddings 1", "tie_word_embeddings", "1", NULL, NULL,
         "\"tie_word_embeddings\""},
        {"model_type a number", "model_type", "5", NULL, NULL, "\"model_type\""},
        {"torch_dtype a number", "torch_dtype", "16", NULL, NULL, "\"torch_dtype\""},
        {"torch_dtype too long", "torch_dtype", "\"bfloat16bfloat16\"", NULL, NULL,
         "\"torch_dtype\""},
        {"num_hidden_layers 0", "num_hidden_layers", "0", NULL, NULL, "\"num_hidden_layers\""},
        {"vocab_size -1", "vocab_size", "-1", NULL, NULL, "\"vocab_size\""},
        {"intermediate_size 0", "intermediate_size", "0", NULL, NULL, "\"intermediate_size\""},
        {"head_dim 0", "head_dim", "0", NULL, NULL, "\"head_dim\""},
        {"max_position_embeddings 0", "max_position_embeddings", "0", NULL, NULL,
         "\"max_position_embeddings\""},
        {"rms_norm_eps 0", "rms_norm_eps", "0", NULL, NULL, "\"rms_norm_eps\""},
        {"rope_theta -1", "rope_theta", "-1.0", NULL, NULL, "\"rope_theta\""},
        {"hidden not divisible by heads", "hidden_size", "100", "num_attention_heads", "3",
         "\"hidden_size\""},
        {"heads not divisible by kv", "num_key_value_heads", "5", NULL, NULL,
         "\"num_key_value_heads\""},
        {"rope_scaling llama3 without keys", "rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8.0}", NULL, NULL,
         "\"rope_scaling.low_freq_factor\""},
        {"rope_scaling yarn", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
         NULL, NULL, "\"rope_scaling.rope_type\" is \"yarn\""},
        {"rope_scaling linear (old name)", "rope_scaling",
         "{\"type\": \"linear\", \"factor\": 2.0}", NULL, NULL, "\"rope_scaling.type\""},
        {"rope_scaling a number", "rope_scaling", "2", NULL, NULL, "\"rope_scaling\""},
        {"rope_scaling high <= low", "rope_scaling",
         "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
         "\"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}", NULL, NULL,
         "\"rope_scaling.high_freq_factor\""},
        {"mistral with a sliding window", "model_type", "\"mistral\"", "sliding_window", "1024",
         "\"sliding_window\""},
        {"model_type gemma", "model_type", "\"gemma\"", NULL, NULL, "\"model_type\""},
        {"qwen2 with use_sliding_window", "model_type", "\"qwen2\"", "use_sliding_window",
         "true", "\"use_sliding_window\""},
        {"attention_bias true", "attention_bias", "true", NULL, NULL, "\"attention_bias\""},
        {"mlp_bias true", "mlp_bias", "true", NULL, NULL, "\"mlp_bias\""},
        {"hidden_act gelu", "hidden_act", "\"gelu\"", NULL, NULL, "\"hidden_act\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(name, sizeof name, "bad_%zu", i);
        expect_reject(cases[i].what,
                      make_cfg(name, cases[i].key, cases[i].value, cases[i].key2, cases[i].value2),
                      name, cases[i].expect);
    }
    write_text(TMP "/notjson.json", "{\"vocab_size\": 32000,");
    expect_reject("not JSON", TMP "/notjson.json", "notjson.json", "JSON");
    write_text(TMP "/array.json", "[1, 2]");
    expect_reject("not an object", TMP "/array.json", "array.json", "object");
    write_text(TMP "/dupkey.json", "{\"vocab_size\": 1, \"vocab_size\": 2}");
    expect_reject("a key given twice", TMP "/dupkey.json", "dupkey.json", "duplicate");
    expect_reject("missing file", TMP "/absent.json", "absent.json", NULL);

    /* a FIFO is refused, naming it, not waited on: as the file, as config.json in a folder,
     * and by the other readers of config.json */
    signal(SIGALRM, on_alarm);
    alarm(20);
    mkfifo(TMP "/fifo.json", 0600);
    expect_reject("a FIFO", TMP "/fifo.json", "fifo.json", "not a regular file (a FIFO)");
    unlink(TMP "/fifo.json");
    mkdir(TMP "/fifo_dir", 0755);
    mkfifo(TMP "/fifo_dir/config.json", 0600);
    expect_reject("a FIFO as config.json", TMP "/fifo_dir", "fifo_dir/config.json",
                  "not a regular file (a FIFO)");
    char err[512] = "", type[32];
    check(tz_hf_model_type(TMP "/fifo_dir", type, sizeof type, err, sizeof err) != 0 &&
              strstr(err, "not a regular file (a FIFO)"), "model_type of a FIFO: %s", err);
    err[0] = 0;
    check(tz_hf_config_rewrite(TMP "/fifo_dir/config.json", TMP "/never.json", NULL, NULL, err,
                               sizeof err) != 0 && strstr(err, "not a regular file (a FIFO)"),
          "rewrite of a FIFO: %s", err);
    unlink(TMP "/fifo_dir/config.json");
    rmdir(TMP "/fifo_dir");
    alarm(0);
}

int main(void) {
    mkdir(TMP, 0755);
    test_good();
    test_write();
    test_bad();
    printf("hf_config: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
