/* Loss curves to PNG: metrics.jsonl read with jansson, drawn on an RGB canvas with lines,
 * squares and a 3x5 bitmap font (digits, capitals, a few signs), written by io/png.c. The
 * training loss is drawn twice, each step pale and a moving average over it in full colour;
 * the evaluation points go on top, outlined, so that they show over any curve. */
#include "io/loss_plot.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/png.h"

enum { PW = 900, PH = 540, ML = 80, MR = 24, MT = 24, MB = 56, FS = 2 /* font scale */ };

typedef struct series {
    int64_t n, cap;
    double *x, *y;
} series;

typedef struct canvas {
    uint8_t *px;
    int64_t w, h;
} canvas;

static void series_add(series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->x = tz_xrealloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = tz_xrealloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

/* The train and eval points of the records in dir (records without a step, and nulls,
 * skipped). */
static int read_metrics(const tz_loss_plot_keys *k, const char *dir, series *tr, series *ev,
                        char *err, size_t errlen) {
    char path[1100];
    tz_path_join(path, sizeof path, dir, k->file);
    FILE *f = fopen(path, "r");
    if (!f) return tz_errf(err, errlen, "%s: cannot open (is %s a run folder?)", path, dir);
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        json_t *step = json_object_get(o, k->step), *l = json_object_get(o, k->loss),
               *e = json_object_get(o, k->eval_loss);
        if (json_is_integer(step)) {
            double x = (double)json_integer_value(step);
            if (json_is_number(l)) series_add(tr, x, json_number_value(l));
            if (json_is_number(e)) series_add(ev, x, json_number_value(e));
        }
        json_decref(o);
    }
    fclose(f);
    return 0;
}

static void put(canvas *c, int64_t x, int64_t y, const uint8_t rgb[3]) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    memcpy(c->px + (y * c->w + x) * 3, rgb, 3);
}

static void rect(canvas *c, int64_t x0, int64_t y0, int64_t w, int64_t h, const uint8_t rgb[3]) {
    for (int64_t y = y0; y < y0 + h; y++)
        for (int64_t x = x0; x < x0 + w; x++) put(c, x, y, rgb);
}

/* A line of thickness t (square pen), Bresenham. */
static void line(canvas *c, int64_t x0, int64_t y0, int64_t x1, int64_t y1, int t,
                 const uint8_t rgb[3]) {
    int64_t dx = llabs(x1 - x0), dy = -llabs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int64_t e = dx + dy;
    for (;;) {
        rect(c, x0 - t / 2, y0 - t / 2, t, t, rgb);
        if (x0 == x1 && y0 == y1) break;
        int64_t e2 = 2 * e;
        if (e2 >= dy) e += dy, x0 += sx;
        if (e2 <= dx) e += dx, y0 += sy;
    }
}

/* 3x5 glyphs, rows top to bottom, bit 4 the left column; lower case draws as upper case. */
static const uint8_t *glyph(char ch) {
    static const uint8_t digits[10][5] = {{7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7},
                                          {7, 1, 7, 1, 7}, {5, 5, 7, 1, 1}, {7, 4, 7, 1, 7},
                                          {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1}, {7, 5, 7, 5, 7},
                                          {7, 5, 7, 1, 7}};
    static const uint8_t letters[26][5] = {
        {2, 5, 7, 5, 5}, {6, 5, 6, 5, 6}, {3, 4, 4, 4, 3}, {6, 5, 5, 5, 6}, {7, 4, 6, 4, 7},
        {7, 4, 6, 4, 4}, {3, 4, 5, 5, 3}, {5, 5, 7, 5, 5}, {7, 2, 2, 2, 7}, {1, 1, 1, 5, 2},
        {5, 5, 6, 5, 5}, {4, 4, 4, 4, 7}, {5, 7, 7, 5, 5}, {6, 5, 5, 5, 5}, {2, 5, 5, 5, 2},
        {6, 5, 6, 4, 4}, {2, 5, 5, 6, 3}, {6, 5, 6, 5, 5}, {3, 4, 2, 1, 6}, {7, 2, 2, 2, 2},
        {5, 5, 5, 5, 7}, {5, 5, 5, 5, 2}, {5, 5, 7, 7, 5}, {5, 5, 2, 5, 5}, {5, 5, 2, 2, 2},
        {7, 1, 2, 4, 7}};
    static const struct { char c; uint8_t g[5]; } signs[] = {
        {'.', {0, 0, 0, 0, 2}}, {'-', {0, 0, 7, 0, 0}}, {'+', {0, 2, 7, 2, 0}},
        {'_', {0, 0, 0, 0, 7}}, {'/', {1, 1, 2, 4, 4}}, {':', {0, 2, 0, 2, 0}},
        {'(', {1, 2, 2, 2, 1}}, {')', {4, 2, 2, 2, 4}}, {'=', {0, 7, 0, 7, 0}},
        {',', {0, 0, 0, 2, 4}}};
    static const uint8_t blank[5] = {0, 0, 0, 0, 0};
    if (ch >= '0' && ch <= '9') return digits[ch - '0'];
    if (ch >= 'a' && ch <= 'z') ch = (char)(ch - 'a' + 'A');
    if (ch >= 'A' && ch <= 'Z') return letters[ch - 'A'];
    for (size_t i = 0; i < sizeof signs / sizeof signs[0]; i++)
        if (signs[i].c == ch) return signs[i].g;
    return blank;
}

/* Text at (x, y) (top left); returns its width in pixels. */
static int64_t text(canvas *c, int64_t x, int64_t y, const char *s, const uint8_t rgb[3]) {
    int64_t x0 = x;
    for (; *s; s++, x += 4 * FS) {
        const uint8_t *g = glyph(*s);
        for (int r = 0; r < 5; r++)
            for (int k = 0; k < 3; k++)
                if (g[r] & (4 >> k)) rect(c, x + k * FS, y + r * FS, FS, FS, rgb);
    }
    return x - x0;
}

static int64_t text_width(const char *s) { return (int64_t)strlen(s) * 4 * FS; }

/* A tick spacing of 1, 2 or 5 times a power of ten giving about n intervals over range. */
static double nice_step(double range, int n) {
    double raw = range / n, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static const uint8_t palette[8][3] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44},
                                      {255, 127, 14}, {148, 103, 189}, {140, 86, 75},
                                      {227, 119, 194}, {23, 190, 207}};

/* The name a run's folder goes by: its last component, or for a folder named staging (a
 * run in progress, run.dir/staging) its parent's. */
static void run_name(const char *dir, char *out, size_t n) {
    char d[1100];
    snprintf(d, sizeof d, "%s", dir);
    size_t k = strlen(d);
    while (k > 1 && d[k - 1] == '/') d[--k] = 0;
    char *last = strrchr(d, '/');
    if (!strcmp(last ? last + 1 : d, "staging") && last && last != d) {
        *last = 0;
        last = strrchr(d, '/');
    } else if (!strcmp(d, "staging")) {
        snprintf(out, n, "staging");
        return;
    }
    snprintf(out, n, "%.40s", last && last[1] ? last + 1 : d);
}

/* c mixed with white: a = 1 is c, a = 0 white. */
static void tint(const uint8_t c[3], double a, uint8_t out[3]) {
    for (int k = 0; k < 3; k++) out[k] = (uint8_t)lround(255.0 - a * (255.0 - c[k]));
}

/* The centred moving average of s over 2h+1 points (fewer at the ends), into m. */
static void smooth(const series *s, int64_t h, double *m) {
    for (int64_t j = 0; j < s->n; j++) {
        double sum = 0;
        int64_t c = 0;
        for (int64_t i = j - h; i <= j + h; i++)
            if (i >= 0 && i < s->n && isfinite(s->y[i])) sum += s->y[i], c++;
        m[j] = c ? sum / (double)c : NAN;
    }
}

int tz_loss_plot_write(const tz_loss_plot_keys *keys, const char *const *dirs,
                       const char *const *names, int n, const char *out, char *err, size_t errlen) {
    series *tr = tz_xcalloc((size_t)n, sizeof *tr), *ev = tz_xcalloc((size_t)n, sizeof *ev);
    int rc = 0;
    double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n && !rc; i++) {
        rc = read_metrics(keys, dirs[i], &tr[i], &ev[i], err, errlen);
        for (int k = 0; k < 2 && !rc; k++) {
            const series *s = k ? &ev[i] : &tr[i];
            for (int64_t j = 0; j < s->n; j++) {
                if (!isfinite(s->y[j])) continue;
                x1 = s->x[j] > x1 ? s->x[j] : x1;
                y0 = s->y[j] < y0 ? s->y[j] : y0;
                y1 = s->y[j] > y1 ? s->y[j] : y1;
            }
        }
    }
    if (!rc && !(y1 >= y0))
        rc = tz_errf(err, errlen, "%s: no loss recorded in the runs given", out);
    if (!rc) {
        if (y1 - y0 < 1e-6) y0 -= 0.5, y1 += 0.5;
        double pad = 0.05 * (y1 - y0);
        y0 -= pad, y1 += pad;
        canvas c = {tz_xmalloc((size_t)PW * PH * 3), PW, PH};
        memset(c.px, 255, (size_t)PW * PH * 3);
        static const uint8_t ink[3] = {0, 0, 0}, grid[3] = {225, 225, 225};
        const int64_t gx0 = ML, gx1 = PW - MR, gy0 = MT, gy1 = PH - MB;
#define PX(v) (gx0 + (int64_t)llround(((v) - x0) / (x1 - x0) * (double)(gx1 - gx0)))
#define PY(v) (gy1 - (int64_t)llround(((v) - y0) / (y1 - y0) * (double)(gy1 - gy0)))
        char lab[64];
        double st = nice_step(y1 - y0, 6);
        for (double v = ceil(y0 / st) * st; v <= y1; v += st) {
            line(&c, gx0, PY(v), gx1, PY(v), 1, grid);
            snprintf(lab, sizeof lab, "%.4g", fabs(v) < 1e-12 ? 0.0 : v);
            text(&c, gx0 - 8 - text_width(lab), PY(v) - 5, lab, ink);
        }
        st = nice_step(x1 - x0, 8);
        if (st < 1) st = 1;
        for (double v = ceil(x0 / st) * st; v <= x1; v += st) {
            line(&c, PX(v), gy0, PX(v), gy1, 1, grid);
            snprintf(lab, sizeof lab, "%.0f", v);
            text(&c, PX(v) - text_width(lab) / 2, gy1 + 8, lab, ink);
        }
        line(&c, gx0, gy0, gx0, gy1, 1, ink);
        line(&c, gx0, gy1, gx1, gy1, 1, ink);
        text(&c, (gx0 + gx1) / 2 - text_width("STEP") / 2, gy1 + 30, "STEP", ink);
        text(&c, 8, MT - 16, "LOSS", ink);
        int64_t ly = gy0 + 8;
        for (int i = 0; i < n; i++) { /* every run's training curves first */
            const uint8_t *col = palette[i % 8];
            uint8_t pale[3];
            tint(col, 0.35, pale);
            const int64_t h = tr[i].n < 8 ? 0 : tr[i].n < 80 ? 1 : tr[i].n / 40;
            double *m = tz_xmalloc((size_t)(tr[i].n + 1) * sizeof *m);
            smooth(&tr[i], h, m);
            for (int pass = h > 0 ? 0 : 1; pass < 2; pass++)
                for (int64_t j = 1; j < tr[i].n; j++) {
                    const double a = pass ? m[j - 1] : tr[i].y[j - 1], b = pass ? m[j] : tr[i].y[j];
                    if (isfinite(a) && isfinite(b))
                        line(&c, PX(tr[i].x[j - 1]), PY(a), PX(tr[i].x[j]), PY(b), pass ? 2 : 1,
                             pass ? col : pale);
                }
            free(m);
        }
        for (int i = 0; i < n; i++) { /* then the evaluations, on top, outlined */
            const uint8_t *col = palette[i % 8];
            for (int64_t j = 0; j < ev[i].n; j++) {
                if (!isfinite(ev[i].y[j])) continue;
                if (j && isfinite(ev[i].y[j - 1]))
                    line(&c, PX(ev[i].x[j - 1]), PY(ev[i].y[j - 1]), PX(ev[i].x[j]),
                         PY(ev[i].y[j]), 1, col);
            }
            for (int64_t j = 0; j < ev[i].n; j++) {
                if (!isfinite(ev[i].y[j])) continue;
                rect(&c, PX(ev[i].x[j]) - 6, PY(ev[i].y[j]) - 6, 13, 13, ink);
                rect(&c, PX(ev[i].x[j]) - 4, PY(ev[i].y[j]) - 4, 9, 9, col);
            }
            /* legend: a line for train, a square for eval, the run's name */
            char name[64];
            if (names && names[i]) snprintf(name, sizeof name, "%.40s", names[i]);
            else run_name(dirs[i], name, sizeof name);
            snprintf(lab, sizeof lab, "%s", name);
            int64_t lx = gx1 - 16 - 64 - text_width(lab);
            line(&c, lx, ly + 5, lx + 24, ly + 5, 2, col);
            rect(&c, lx + 34, ly - 1, 13, 13, ink);
            rect(&c, lx + 36, ly + 1, 9, 9, col);
            text(&c, lx + 56, ly, lab, ink);
            ly += 18;
        }
        static const char key1[] = "LINES TRAIN (PALE: EACH STEP, DARK: AVERAGED)";
        static const char key2[] = "SQUARES EVAL";
        text(&c, gx1 - 16 - text_width(key1), ly + 4, key1, ink);
        text(&c, gx1 - 16 - text_width(key2), ly + 20, key2, ink);
#undef PX
#undef PY
        rc = tz_png_write_rgb(out, c.px, PW, PH, err, errlen);
        free(c.px);
    }
    for (int i = 0; i < n; i++) free(tr[i].x), free(tr[i].y), free(ev[i].x), free(ev[i].y);
    free(tr);
    free(ev);
    return rc;
}
