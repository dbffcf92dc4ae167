/* The collective watchdog (see watchdog.h): the record the comm front door keeps, the thread
 * that answers the other ranks' questions and, past the timeout, asks them and aborts. */
#include "comm/watchdog.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"

enum { TAG_QUERY = 1, TAG_REPLY = 2 };
#define TICK_NS 100000000L /* the thread wakes every 0.1 s */
#define OP_MAX 32

/* What a rank tells the others (sent as bytes: every rank runs the same binary). */
typedef struct watch_state {
    int64_t started;     /* collectives started so far */
    int64_t blocked;     /* 1: waiting in a collective */
    int64_t blocked_seq; /* which one */
    int64_t step;        /* tz_watchdog_set_step's mark */
    double waited;       /* seconds waited so far */
    char op[OP_MAX];
} watch_state;

static struct {
    pthread_mutex_t mu;
    int64_t started, blocked_seq, step;
    int blocked;
    const char *op;
    double since;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_t g_thread;
static int g_running;
static atomic_int g_stop;
static MPI_Comm g_comm = MPI_COMM_NULL;
static double g_timeout, g_grace;
static int g_rank, g_size, g_multi;
static watch_state *g_answers; /* one send buffer per asking rank */

static void nap(long ns) {
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

int64_t tz_watch_enter(const char *op) {
    pthread_mutex_lock(&S.mu);
    int64_t k = ++S.started;
    pthread_mutex_unlock(&S.mu);
    (void)op;
    return k;
}

void tz_watch_block(int64_t seq, const char *op) {
    double t = tz_clock_s();
    pthread_mutex_lock(&S.mu);
    S.blocked = 1;
    S.blocked_seq = seq;
    S.op = op;
    S.since = t;
    pthread_mutex_unlock(&S.mu);
}

void tz_watch_unblock(void) {
    pthread_mutex_lock(&S.mu);
    S.blocked = 0;
    pthread_mutex_unlock(&S.mu);
}

/* Where a rank is, from its step mark (tz_watchdog_set_step): "at step 7", "after step 7
 * (between steps: ...)" or before the first step. */
static const char *step_words(int64_t step, char *buf, size_t n) {
    if (step > 0) snprintf(buf, n, "at step %lld", (long long)step);
    else if (step < 0)
        snprintf(buf, n, "after step %lld (between steps: logging, evaluation or saving)",
                 (long long)-step);
    else snprintf(buf, n, "before the first training step (start-up or the first evaluation)");
    return buf;
}

void tz_watchdog_set_step(int64_t step) {
    pthread_mutex_lock(&S.mu);
    S.step = step;
    pthread_mutex_unlock(&S.mu);
}

static watch_state snapshot(void) {
    watch_state w;
    memset(&w, 0, sizeof w);
    double t = tz_clock_s();
    pthread_mutex_lock(&S.mu);
    w.started = S.started;
    w.blocked = S.blocked;
    w.blocked_seq = S.blocked_seq;
    w.step = S.step;
    w.waited = S.blocked ? t - S.since : 0.0;
    snprintf(w.op, sizeof w.op, "%s", S.blocked && S.op ? S.op : "");
    pthread_mutex_unlock(&S.mu);
    return w;
}

/* Answers every question waiting: this rank's state, to the rank that asked. */
static void serve(void) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, g_comm, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        int64_t q = 0;
        MPI_Request r;
        MPI_Recv(&q, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_QUERY, g_comm, MPI_STATUS_IGNORE);
        g_answers[st.MPI_SOURCE] = snapshot();
        if (MPI_Isend(&g_answers[st.MPI_SOURCE], (int)sizeof(watch_state), MPI_BYTE,
                      st.MPI_SOURCE, TAG_REPLY, g_comm, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}

#define APPEND(...)                                                                         \
    do {                                                                                    \
        int m_ = snprintf(buf + n, n < sizeof buf ? sizeof buf - n : 0, __VA_ARGS__);      \
        if (m_ > 0) n += (size_t)m_;                                                        \
    } while (0)

/* The collective `me` waits in has passed the timeout: ask the others, print, abort. */
TZ_NORETURN static void report_and_abort(const watch_state *me) {
    watch_state *rep = calloc((size_t)g_size, sizeof *rep);
    MPI_Request *req = calloc((size_t)g_size, sizeof *req);
    int *got = calloc((size_t)g_size, sizeof *got);
    if (g_multi && rep && req && got) {
        int64_t q = me->blocked_seq;
        for (int p = 0; p < g_size; p++) {
            req[p] = MPI_REQUEST_NULL;
            if (p == g_rank) continue;
            MPI_Request s;
            MPI_Irecv(&rep[p], (int)sizeof(watch_state), MPI_BYTE, p, TAG_REPLY, g_comm, &req[p]);
            if (MPI_Isend(&q, 1, MPI_INT64_T, p, TAG_QUERY, g_comm, &s) == MPI_SUCCESS)
                MPI_Request_free(&s);
        }
        const double deadline = tz_clock_s() + g_grace;
        int left = g_size - 1;
        while (left > 0 && tz_clock_s() < deadline) {
            serve(); /* others may be asking at the same time */
            for (int p = 0; p < g_size; p++)
                if (p != g_rank && !got[p] && req[p] != MPI_REQUEST_NULL) {
                    MPI_Test(&req[p], &got[p], MPI_STATUS_IGNORE);
                    if (got[p]) left--;
                }
            if (left > 0) nap(TICK_NS / 5);
        }
    }
    char buf[4096];
    size_t n = 0;
    APPEND("[rank %d] collective timeout: %s (collective #%lld of the run) ", g_rank, me->op,
           (long long)me->blocked_seq);
    char where[96];
    APPEND("%s ", step_words(me->step, where, sizeof where));
    APPEND("has not completed after %.0f s (run.collective_timeout = %g s)", me->waited, g_timeout);
    if (!g_multi || !rep || !req || !got) {
        APPEND("; the other ranks were not asked (the MPI library gives no MPI_THREAD_MULTIPLE)");
    } else {
        int missing = 0, listed = 0;
        for (int p = 0; p < g_size; p++) {
            if (p == g_rank) continue;
            const watch_state *w = &rep[p];
            if (got[p] && w->started >= me->blocked_seq) continue; /* reached it */
            if (listed < 16) {
                APPEND("%s", missing ? "; " : "; ranks that did not arrive: ");
                if (!got[p])
                    APPEND("rank %d (no answer in %.0f s: stopped, dead or unreachable)", p, g_grace);
                else if (w->blocked)
                    APPEND("rank %d (waiting %.0f s in collective #%lld, %s, %s)", p, w->waited,
                           (long long)w->blocked_seq, w->op, step_words(w->step, where, sizeof where));
                else
                    APPEND("rank %d (alive, busy outside collectives after collective #%lld, "
                           "%s)", p, (long long)w->started, step_words(w->step, where, sizeof where));
                listed++;
            }
            missing++;
        }
        if (missing > listed) APPEND("; and %d more", missing - listed);
        if (!missing)
            APPEND("; every rank reached it: the collective itself does not complete "
                   "(network or MPI library)");
    }
    APPEND("\n[rank %d] HINT: look at the rank(s) named above (a stopped process, a dead "
           "node or link, a stuck file system); raise run.collective_timeout if a rank "
           "legitimately works alone that long (0 = no watchdog). Stopping every rank.\n",
           g_rank);
    if (n >= sizeof buf) buf[sizeof buf - 2] = '\n', buf[sizeof buf - 1] = 0;
    fflush(stdout);
    fputs(buf, stderr);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _Exit(1);
}

static void *watch_main(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop)) {
        nap(TICK_NS);
        if (g_multi) serve();
        watch_state me = snapshot();
        if (me.blocked && me.waited > g_timeout) report_and_abort(&me);
    }
    return NULL;
}

void tz_watchdog_start(double timeout_s) {
    if (g_running || timeout_s <= 0) return;
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_size));
    if (g_size < 2) return;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    MPI_Query_thread(&provided);
    g_multi = provided == MPI_THREAD_MULTIPLE;
    g_timeout = timeout_s;
    g_grace = timeout_s < 2.0 ? 2.0 : timeout_s > 30.0 ? 30.0 : timeout_s;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm));
    MPI_CHECK(MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN));
    g_answers = tz_xcalloc((size_t)g_size, sizeof *g_answers);
    atomic_store(&g_stop, 0);
    if (pthread_create(&g_thread, NULL, watch_main, NULL) != 0)
        TZ_FATAL("cannot start the collective watchdog thread");
    g_running = 1;
    if (!g_multi && g_rank == 0)
        tz_warn("the MPI library gives no MPI_THREAD_MULTIPLE: a collective timeout will stop "
                "the job without naming the ranks that did not arrive");
}

void tz_watchdog_stop(void) {
    if (!g_running) return;
    atomic_store(&g_stop, 1);
    pthread_join(g_thread, NULL);
    g_running = 0;
    MPI_Comm_free(&g_comm);
    g_comm = MPI_COMM_NULL;
    free(g_answers);
    g_answers = NULL;
}
