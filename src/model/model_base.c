/* What the model families share: LoRA initialisation, weight uploads, and the quantized base
 * (option checks and codebook, host-side quantization, the decode scratch of the arena). */
#include "model/model_base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "quant/turboquant.h"

int tz_layer_stack_walk(tz_layer_stack *s, tz_arena *a, size_t *total, int64_t n_layers,
                        int checkpointing, int forward_only, size_t set_bytes,
                        int64_t stream_floats, int x16) {
    return tz_layer_stack_walk_ex(s, NULL, a, total, n_layers, checkpointing, forward_only,
                                  set_bytes, stream_floats, x16, 0);
}

int tz_layer_stack_walk_ex(tz_layer_stack *s, tz_backend *be, tz_arena *a, size_t *total,
                           int64_t n_layers, int checkpointing, int forward_only,
                           size_t set_bytes, int64_t stream_floats, int x16, unsigned opts) {
    const int n_sets = checkpointing || forward_only ? 1 : (int)n_layers;
    x16 = x16 && checkpointing && !forward_only;
    const int on_host = x16 && be && be->device && (opts & TZ_STACK_HOST);
    if (a) {
        tz_layer_stack_free(s);
        s->n_layers = n_layers;
        s->n_sets = n_sets;
        s->set_bytes = set_bytes;
        s->xin = tz_xcalloc((size_t)n_layers + 1, sizeof *s->xin);
        s->sets = tz_xcalloc((size_t)n_sets, set_bytes);
        s->x16 = x16;
        s->stream_floats = stream_floats;
        s->slot_of = s->last_in = -1;
    }
    if (forward_only) { /* two streams, used in turn */
        for (int64_t i = 0; i < 2; i++)
            TZ_ARENA_TAKE(a, total, s->xin[i], stream_floats, "residual stream");
        for (int64_t i = 2; a && i <= n_layers; i++) s->xin[i] = s->xin[i & 1];
        return n_sets;
    }
    /* bf16 streams take half the floats (the arena counts in floats) */
    const int64_t saved = x16 ? (stream_floats + 1) / 2 : stream_floats;
    if (on_host) {
        TZ_ARENA_TAKE(a, total, s->slot, saved, "residual stream slot (bf16; the streams on the host)");
        if (a) {
            s->be = be;
            s->on_host = 1;
            s->host_bytes = (size_t)(n_layers + 1) * (size_t)stream_floats * sizeof(uint16_t);
            /* pinned; a backend that cannot pin (the planning backend, whose copies move
             * nothing) gets no host memory */
            if (be->host_register) {
                s->host = tz_xcalloc(1, s->host_bytes);
                be->host_register(be, s->host, s->host_bytes);
            }
        }
    } else {
        for (int64_t i = 0; i <= n_layers; i++)
            TZ_ARENA_TAKE(a, total, s->xin[i], saved, x16 ? "residual stream (bf16)" : "residual stream");
    }
    if (x16) {
        TZ_ARENA_TAKE(a, total, s->xa, stream_floats, "residual stream read");
        if (!(opts & TZ_STACK_XB_OWN))
            TZ_ARENA_TAKE(a, total, s->xb, stream_floats, "residual stream written");
    }
    return n_sets;
}

void *tz_model_send_host(tz_backend *be, void *dst, const void *src, size_t bytes) {
    void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    be->download_async(be, dst, src, bytes);
    return be->event_mark(be, TZ_QUEUE_COPY);
}

void tz_model_received(tz_backend *be, void *sent) {
    be->event_wait(be, sent, TZ_QUEUE_HOST);
    be->event_free(be, sent);
}

/* Host streams: the compute queue waits for the copy last issued on the slot (before it
 * writes the slot, or reads what an upload brings). */
static void slot_ready(tz_layer_stack *s, tz_backend *be) {
    if (!s->slot_ev) return;
    be->event_wait(be, s->slot_ev, TZ_QUEUE_COMPUTE);
    be->event_free(be, s->slot_ev);
    s->slot_ev = NULL;
}

/* Host streams: a copy between the slot and stream i's host memory on the copy queue, after
 * the compute queue's work so far (which may still read or write the slot) and, the copy
 * queue being in order, after the copies before it. */
static void slot_copy(tz_layer_stack *s, tz_backend *be, int64_t i, int to_host) {
    const size_t bytes = (size_t)s->stream_floats * sizeof(uint16_t);
    uint16_t *h = s->host ? s->host + (size_t)i * (size_t)s->stream_floats : NULL;
    void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    if (to_host) be->download_async(be, h, s->slot, bytes);
    else be->upload_async(be, s->slot, h, bytes);
    if (s->slot_ev) be->event_free(be, s->slot_ev); /* the new one comes after it */
    s->slot_ev = be->event_mark(be, TZ_QUEUE_COPY);
    s->slot_up = !to_host;
    s->slot_of = i;
}

const float *tz_layer_stack_in(tz_layer_stack *s, tz_backend *be, int64_t i) {
    if (!s->x16) return s->xin[i];
    if (!s->on_host) {
        be->from_bf16(be, s->xa, (const uint16_t *)(const void *)s->xin[i], s->stream_floats);
        return s->xa;
    }
    if (s->slot_of != i) slot_copy(s, be, i, 0);
    if (s->slot_up) slot_ready(s, be); /* (a download only reads the slot, as this does) */
    be->from_bf16(be, s->xa, s->slot, s->stream_floats);
    /* read in descending order (backward, or the same stream again): fetch the one below
     * while the caller works on this one */
    if (i > 0 && s->last_in >= i) slot_copy(s, be, i - 1, 0);
    s->last_in = i;
    return s->xa;
}

float *tz_layer_stack_out(tz_layer_stack *s, int64_t i) { return s->x16 ? s->xb : s->xin[i]; }

void tz_layer_stack_put(tz_layer_stack *s, tz_backend *be, int64_t i) {
    if (!s->x16) return;
    if (!s->on_host) {
        be->to_bf16(be, (uint16_t *)(void *)s->xin[i], s->xb, s->stream_floats);
        return;
    }
    slot_ready(s, be);
    be->to_bf16(be, s->slot, s->xb, s->stream_floats);
    slot_copy(s, be, i, 1);
}

int tz_att_keep_wanted(const tz_backend *be, int checkpointing, int forward_only,
                       int64_t n_layers) {
    if (!be->device || !((be->matmul_dtypes >> TZ_DT_BF16) & 1u) || !checkpointing ||
        forward_only || n_layers < 2)
        return 0;
    const char *e = getenv("TZ_ATT_KEEP");
    return !(e && !strcmp(e, "0"));
}

void tz_att_keep_walk(tz_att_keep *k, tz_backend *be, tz_arena *a, size_t *total, int on,
                      int64_t n_layers, int64_t att_floats, int64_t lse_floats, int given0) {
    if (a) {
        tz_att_keep_free(k);
        k->on = on, k->be = be, k->n_layers = n_layers;
        k->att_floats = att_floats, k->lse_floats = lse_floats;
    }
    if (!on) return;
    if (!given0) {
        TZ_ARENA_TAKE(a, total, k->att2[0], att_floats, "attention output kept (the first of two)");
        TZ_ARENA_TAKE(a, total, k->lse2[0], lse_floats, "attention lse kept (the first of two)");
    }
    TZ_ARENA_TAKE(a, total, k->att2[1], att_floats, "attention output kept (the second of two)");
    TZ_ARENA_TAKE(a, total, k->lse2[1], lse_floats, "attention lse kept (the second of two)");
    if (!a || n_layers <= 2) return;
    k->host_bytes = (size_t)(n_layers - 2) * (size_t)(att_floats + lse_floats) * sizeof(float);
    if (be->host_register) { /* pinned; the planning backend's copies move nothing */
        k->host = tz_xcalloc(1, k->host_bytes);
        be->host_register(be, k->host, k->host_bytes);
    }
}

void tz_att_keep_copy(tz_att_keep *k, int64_t l, int to_host, int64_t att, int64_t lse) {
    if (l < 0 || l >= k->n_layers - 2) return;
    tz_backend *be = k->be;
    const int i = (int)(l & 1);
    float *h = k->host ? k->host + (size_t)l * (size_t)(k->att_floats + k->lse_floats) : NULL;
    float *hl = h ? h + k->att_floats : NULL;
    void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    if (to_host) {
        be->download_async(be, h, k->att2[i], (size_t)att * sizeof(float));
        be->download_async(be, hl, k->lse2[i], (size_t)lse * sizeof(float));
    } else {
        be->upload_async(be, k->att2[i], h, (size_t)att * sizeof(float));
        be->upload_async(be, k->lse2[i], hl, (size_t)lse * sizeof(float));
    }
    if (k->ev[i]) be->event_free(be, k->ev[i]); /* the new one comes after it */
    k->ev[i] = be->event_mark(be, TZ_QUEUE_COPY);
}

int tz_att_keep_take(tz_att_keep *k, int64_t l) {
    const int i = (int)(l & 1);
    if (k->ev[i]) {
        k->be->event_wait(k->be, k->ev[i], TZ_QUEUE_COMPUTE);
        k->be->event_free(k->be, k->ev[i]);
        k->ev[i] = NULL;
    }
    return i;
}

void tz_att_keep_free(tz_att_keep *k) {
    tz_backend *be = k->be;
    for (int i = 0; i < 2; i++)
        if (k->ev[i]) {
            be->event_wait(be, k->ev[i], TZ_QUEUE_HOST);
            be->event_free(be, k->ev[i]);
        }
    if (k->host) {
        be->host_unregister(be, k->host);
        free(k->host);
    }
    memset(k, 0, sizeof *k);
}

void tz_layer_stack_free(tz_layer_stack *s) {
    if (s->on_host) {
        tz_backend *be = s->be;
        if (s->slot_ev) {
            be->event_wait(be, s->slot_ev, TZ_QUEUE_HOST);
            be->event_free(be, s->slot_ev);
        }
        if (s->host) be->host_unregister(be, s->host);
        free(s->host);
    }
    free(s->xin);
    free(s->sets);
    memset(s, 0, sizeof *s);
}

/* Every parameter whose adapter flag is `adapters`, filled from its own stream and uploaded. */
static void init_params(tz_params *ps, tz_backend *be, const tz_tq_codebook *cb, uint64_t seed,
                        int purpose, int adapters, tz_init_fill fill, void *ctx) {
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (p->adapter != adapters) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, (uint64_t)purpose, 0);
        float *h = tz_xmalloc((size_t)p->numel * sizeof *h);
        fill(ctx, i, p, &r, h);
        tz_model_upload_param(be, cb, p, h);
        free(h);
    }
}

void tz_model_init_base(tz_params *ps, tz_backend *be, const tz_tq_codebook *cb, uint64_t seed,
                        tz_init_fill fill, void *ctx) {
    init_params(ps, be, cb, seed, TZ_RNG_INIT, 0, fill, ctx);
}

static void fill_lora(void *ctx, int i, const tz_param *p, tz_rng *r, float *h) {
    const int is_a = strstr(p->name, "lora_A") != NULL;
    const double bound = 1.0 / sqrt((double)p->shape[1]);
    for (int64_t k = 0; k < p->numel; k++)
        h[k] = is_a ? (float)(bound * (2.0 * tz_rng_uniform(r) - 1.0)) : 0.0f;
}

void tz_model_init_lora(tz_params *ps, tz_backend *be, uint64_t seed) {
    init_params(ps, be, NULL, seed, TZ_RNG_LORA, 1, fill_lora, NULL);
}

void tz_model_upload_param(tz_backend *be, const tz_tq_codebook *cb, tz_param *p,
                           const float *w) {
    if (!p->q) {
        tz_param_upload(be, p, w, 0, p->numel);
        return;
    }
    tz_quant_upload(be, cb, p, w);
    if (p->trainable) { /* its fp32 master starts at the dense weight, not at the decoded one */
        if (!p->init) p->init = tz_xmalloc((size_t)p->numel * sizeof *p->init);
        memcpy(p->init, w, (size_t)p->numel * sizeof *w);
    }
}

void tz_quant_prepare(const tz_quant_opts *q, tz_tq_codebook *cb, float *levels) {
    char err[256];
    if (q->bits < 1 || q->bits > TZ_TQ_MAX_BITS)
        TZ_FATAL("quantization bits %d out of range (1..%d)", q->bits, TZ_TQ_MAX_BITS);
    if (q->group != 64 && q->group != 128 && q->group != 256)
        TZ_FATAL("quantization group %d is not 64, 128 or 256", q->group);
    if (q->method != TZ_TQ_TURBOQUANT && q->method != TZ_TQ_ABSMAX)
        TZ_FATAL("unknown quantization method %d", q->method);
    memset(cb, 0, sizeof *cb);
    if (q->method == TZ_TQ_TURBOQUANT && tz_tq_codebook_init(cb, q->bits, err, sizeof err))
        TZ_FATAL("%s", err);
    tz_tq_levels(q->method, q->bits, cb, levels);
}

const tz_tq_codebook *tz_quant_codebook(const tz_tq_codebook *cb, int method, int bits,
                                        tz_tq_codebook *local) {
    char err[256];
    if (method != TZ_TQ_TURBOQUANT || cb->bits == bits) return cb;
    if (tz_tq_codebook_init(local, bits, err, sizeof err)) TZ_FATAL("%s", err);
    return local;
}

void tz_quant_upload(tz_backend *be, const tz_tq_codebook *cb, tz_param *p, const float *w) {
    tz_qweight *q = p->q;
    tz_tq_codebook local;
    const tz_tq_codebook *c = tz_quant_codebook(cb, q->method, q->bits, &local);
    tz_tq_tensor t;
    char err[256];
    if (tz_tq_tensor_init(&t, q->bits, q->group, p->shape[0], p->shape[1], q->seed, err,
                          sizeof err))
        TZ_FATAL("%s: %s", p->name, err);
    tz_tq_quantize_as(&t, q->method, c, w);
    tz_qweight_codes_put(be, q, 0, t.codes, (size_t)tz_tq_codes_bytes(t.rows, t.cols, t.bits));
    be->upload(be, q->scales, t.scales,
               (size_t)tz_tq_scales_count(t.rows, t.cols, t.group) * sizeof *t.scales);
    tz_tq_tensor_free(&t);
}

size_t tz_quant_scratch_walk(tz_tq_scratch *s, const tz_params *ps, tz_arena *a, int64_t rows,
                             const tz_backend *be, int backward, int64_t lora_rank, int biases) {
    int64_t act = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (!p->q || p->q->method != TZ_TQ_TURBOQUANT) continue;
        tz_linear l = {.in = p->shape[1], .out = p->shape[0], .w = (tz_param *)p, .r = lora_rank};
        const tz_linear *lp = &l;
        const int64_t n = tz_linear_act_floats(be, &lp, 1, rows, backward);
        if (n > act) act = n;
    }
    return tz_quant_scratch_walk_act(s, ps, a, act, be,
                                     tz_linear_fold_cols(be, lora_rank, biases));
}

size_t tz_quant_scratch_walk_act(tz_tq_scratch *s, const tz_params *ps, tz_arena *a,
                                 int64_t act_floats, const tz_backend *be, int64_t fold_cols) {
    /* the tile holds the type the backend decodes into: bf16 where its GEMMs take bf16
     * (tq_matmul decodes straight into it), else fp32 (a backend told bf16 without bf16
     * GEMMs, as a test tells the CPU, decodes into fp32 and multiplies in fp32) */
    const size_t tile_elem =
        be->matmul_dtype == TZ_DT_BF16 && ((be->matmul_dtypes >> TZ_DT_BF16) & 1u) ? 2 : 4;
    int64_t tile = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (!p->q) continue;
        const int64_t rows = p->shape[0], cols = p->shape[1];
        const int64_t ld = cols + (p->q->method == TZ_TQ_TURBOQUANT ? fold_cols : 0);
        const int64_t t = tz_tq_tile_elems(be, rows, cols, ld, p->q->group);
        if (t > tile) tile = t;
    }
    const size_t tb = (size_t)tile * tile_elem, rb = (size_t)act_floats * 4;
    if (a) {
        memset(s, 0, sizeof *s);
        if (tile) s->tile = tz_arena_alloc(a, tb, "quantized weight tile");
        if (act_floats) s->act = tz_arena_alloc(a, rb, "rotated activations");
        s->tile_elems = tile;
        s->act_floats = act_floats;
    }
    return (tile ? (tb + 63) & ~(size_t)63 : 0) + (act_floats ? (rb + 63) & ~(size_t)63 : 0);
}
