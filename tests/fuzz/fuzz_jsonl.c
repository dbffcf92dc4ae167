/* JSONL records as `turbozero prep jsonl` reads them (io/prep.c): the input is the JSONL file,
 * tokenized with a trimmed Llama 3 tokenizer (tests/fuzz/jsonl/: byte-level BPE with the
 * Llama 3 and ChatML special tokens, BOS and EOS named beside it) under one of the templates,
 * picked by the input's length so every template sees every kind of record. */
#include "fuzz_common.h"
#include "io/prep.h"

static const char *const templates[] = {NULL, "llama3", "llama2", "chatml", "plain"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    char tok[600], in[600], out[600], val[600], err[2048] = "";
    if (!ready) {
        fz_copy_data("jsonl/tokenizer.json", "tokenizer.json");
        fz_copy_data("jsonl/tokenizer_config.json", "tokenizer_config.json");
        ready = 1;
    }
    fz_path(tok, "tokenizer.json");
    fz_path(out, "train.tok");
    fz_path(val, "val.tok");
    fz_file(in, "data.jsonl", data, size);
    /* prep prints what it wrote: not while fuzzing */
    fflush(stdout);
    int saved = dup(1), null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    int rc = tz_prep_jsonl(tok, in, out, val, 0.25, templates[size % 5], err, sizeof err);
    fflush(stdout);
    if (saved >= 0) dup2(saved, 1), close(saved);
    if (null >= 0) close(null);
    if (rc) fz_rejected(err, NULL);
    unlink(out);
    unlink(val);
    return 0;
}
