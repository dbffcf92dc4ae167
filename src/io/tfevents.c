/* TensorBoard event files written by hand: the TFRecord framing (u64 length, masked CRC-32C
 * of the length, the bytes, masked CRC-32C of the bytes) around Event messages
 * (tensorflow/core/util/event.proto: wall_time = 1, step = 2, file_version = 3, summary = 5;
 * Summary.value = 1; Value.tag = 1, Value.simple_value = 2). No protobuf library. */
#define _GNU_SOURCE /* timegm */
#include "io/tfevents.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsutil.h"

uint32_t tz_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* the reflected Castagnoli polynomial */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tz_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---- protobuf by hand ---- */

typedef struct pb {
    uint8_t b[512];
    size_t n;
} pb;

static void pb_bytes(pb *o, const void *p, size_t n) {
    if (o->n + n > sizeof o->b) n = o->n < sizeof o->b ? sizeof o->b - o->n : 0;
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void pb_varint(pb *o, uint64_t v) {
    uint8_t t[10];
    size_t k = 0;
    do {
        t[k++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(o, t, k);
}

static void pb_le(pb *o, uint64_t v, int bytes) {
    uint8_t t[8];
    for (int i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(o, t, (size_t)bytes);
}

/* Field `field` of wire type 2 (length-delimited). */
static void pb_len(pb *o, int field, const void *p, size_t n) {
    pb_varint(o, (uint64_t)(field << 3 | 2));
    pb_varint(o, n);
    pb_bytes(o, p, n);
}

/* An Event with wall_time and step, then either file_version or one scalar summary. */
static void event(pb *e, double wall, int64_t step, const char *version, const char *tag,
                  float value) {
    uint64_t w;
    memcpy(&w, &wall, 8);
    e->n = 0;
    pb_varint(e, 1 << 3 | 1); /* wall_time, fixed64 */
    pb_le(e, w, 8);
    pb_varint(e, 2 << 3 | 0); /* step, varint */
    pb_varint(e, (uint64_t)step);
    if (version) {
        pb_len(e, 3, version, strlen(version));
        return;
    }
    pb v = {.n = 0}, s = {.n = 0};
    uint32_t f;
    memcpy(&f, &value, 4);
    pb_len(&v, 1, tag, strlen(tag) < 200 ? strlen(tag) : 200);
    pb_varint(&v, 2 << 3 | 5); /* simple_value, fixed32 */
    pb_le(&v, f, 4);
    pb_len(&s, 1, v.b, v.n); /* Summary.value */
    pb_len(e, 5, s.b, s.n);  /* Event.summary */
}

static void record(tz_tfevents *w, const pb *e) {
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)e->n >> (8 * i));
    uint32_t c1 = tz_crc32c_mask(tz_crc32c(len, 8)), c2 = tz_crc32c_mask(tz_crc32c(e->b, e->n));
    uint8_t t1[4], t2[4];
    for (int i = 0; i < 4; i++) t1[i] = (uint8_t)(c1 >> (8 * i)), t2[i] = (uint8_t)(c2 >> (8 * i));
    fwrite(len, 1, 8, w->f);
    fwrite(t1, 1, 4, w->f);
    fwrite(e->b, 1, e->n, w->f);
    fwrite(t2, 1, 4, w->f);
}

/* ---- the writer ---- */

int tz_tfevents_open(tz_tfevents *w, const char *dir, char *err, size_t n) {
    memset(w, 0, sizeof *w);
    if (tz_mkdir_p(dir, err, n)) return 1;
    char host[256] = "localhost", name[400];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s", (long long)ts.tv_sec, host);
    tz_path_join(w->path, sizeof w->path, dir, name);
    w->f = fopen(w->path, "wbe");
    if (!w->f) return tz_errf(err, n, "%s: cannot create: %s", w->path, strerror(errno));
    pb e;
    event(&e, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, 0, "brain.Event:2", NULL, 0.0f);
    record(w, &e);
    return 0;
}

void tz_tfevents_scalar(tz_tfevents *w, double wall_time, int64_t step, const char *tag,
                        float value) {
    if (!w->f) return;
    pb e;
    event(&e, wall_time, step, NULL, tag, value);
    record(w, &e);
}

/* "2026-11-23T11:58:26.025Z" as seconds since the epoch; the time now when it does not parse. */
static double iso_seconds(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int ms = 0;
    if (s && sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                    &tm.tm_min, &tm.tm_sec, &ms) >= 6) {
        tm.tm_year -= 1900, tm.tm_mon -= 1;
        return (double)timegm(&tm) + 1e-3 * ms;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tz_tfevents_json_line(tz_tfevents *w, const char *line) {
    json_t *o = json_loads(line, 0, NULL);
    json_t *step = json_object_get(o, "step");
    int count = 0;
    if (json_is_object(o) && json_is_integer(step) && !json_object_get(o, "summary")) {
        const double wall = iso_seconds(json_string_value(json_object_get(o, "time")));
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) {
            if (!json_is_number(v) || !strcmp(key, "step")) continue;
            char tag[160];
            if (!strncmp(key, "eval_", 5)) snprintf(tag, sizeof tag, "eval/%s", key + 5);
            else snprintf(tag, sizeof tag, "train/%s", key);
            tz_tfevents_scalar(w, wall, (int64_t)json_integer_value(step), tag,
                               (float)json_number_value(v));
            count++;
        }
    }
    json_decref(o);
    return count;
}

int64_t tz_tfevents_json_file(tz_tfevents *w, const char *path) {
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    int64_t n = 0;
    while (getline(&line, &cap, f) > 0) n += tz_tfevents_json_line(w, line);
    free(line);
    fclose(f);
    return n;
}

int tz_tfevents_flush(tz_tfevents *w, char *err, size_t n) {
    if (!w->f) return 0;
    if (fflush(w->f) != 0 || ferror(w->f))
        return tz_errf(err, n, "%s: write failed: %s", w->path, strerror(errno ? errno : EIO));
    return 0;
}

int tz_tfevents_close(tz_tfevents *w, char *err, size_t n) {
    if (!w->f) return 0;
    int rc = tz_tfevents_flush(w, err, n);
    if (!rc && fsync(fileno(w->f)) != 0)
        rc = tz_errf(err, n, "%s: fsync failed: %s", w->path, strerror(errno));
    if (fclose(w->f) != 0 && !rc)
        rc = tz_errf(err, n, "%s: close failed: %s", w->path, strerror(errno));
    w->f = NULL;
    return rc;
}

void tz_tfevents_discard(tz_tfevents *w) {
    if (!w->f) return;
    fclose(w->f);
    w->f = NULL;
    unlink(w->path);
}
