/* checkpoint.json (train/checkpoint_resume.c): the input is checked as the checkpoint.json of
 * a folder step-4, as resume checks it before it reads anything the file points to. An
 * accepted file is consistent in itself: the property checked is that no input crashes,
 * leaks or is refused without a message naming checkpoint.json. */
#include "fuzz_common.h"
#include "train/checkpoint_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1), err[TZ_CKPT_MSG] = "";
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    if (tz_ckpt_meta_check(text, 4, err, sizeof err)) fz_rejected(err, "checkpoint.json");
    err[0] = 0;
    if (tz_ckpt_meta_check(text, -1, err, sizeof err)) fz_rejected(err, "checkpoint.json");
    free(text);
    return 0;
}
