/* The native workers' pool as its two sides share it: the workers and slow paths
 * (_nativeio.c) and the event loop's side, which submits and reaps through rings without
 * the workers' lock (_nativeio_submit.c). Private to the library. */
#ifndef ASYNCTIER_NATIVEIO_POOL_H
#define ASYNCTIER_NATIVEIO_POOL_H

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "_nativeio.h"

struct at_pool {
    pthread_mutex_t mu;    /* the workers' (and the slow paths'): queues, tokens, stopping */
    pthread_cond_t tokens; /* a token freed (for at_acquire) */
    /* workers park on this event count (park_worker), not on a condition variable under mu:
     * a submission must wake them without taking mu */
    uint32_t work_seq;
    int32_t work_waiters;
    /* the submission ring: slots queued by at_submit*, taken into the queues by the workers
     * (drain, under mu). Never full: a slot is in it at most once, until it is reaped */
    pthread_mutex_t sub_mu; /* the submitters' own (one loop thread: never waited for) and at_shutdown's */
    int sub_closed;         /* under sub_mu: at_shutdown was called */
    int32_t *sq;
    uint64_t sq_head; /* under mu; counts (64 bits: never wraps), the entry is at % nops */
    uint64_t sq_tail; /* written under sub_mu, read atomically */
    int head[NPRIO], tail[NPRIO];
    int queued;
    int ntokens, in_flight, peak;
    int bound; /* the tokens there are */
    int acq_waiting[NPRIO]; /* threads in at_acquire, by priority: a freed token is theirs
                             * before a queued job's of the same or a lower priority */
    int stopping;
    int nops;
    struct at_op *ops;
    struct at_res *res;
    struct at_op *subs;    /* AT_GROUP's sub-jobs: GROUP_MAX per slot */
    struct at_res *subres; /* and their outcomes (at_group_results) */
    int post_head, post_tail; /* reads whose I/O is done, to be hashed (FIFO): slots and groups' jobs (post_op) */
    /* the completion ring of slot indices: written by workers under mu, read by the one
     * thread that reaps (at_reap) without it */
    int32_t *done;
    uint64_t done_head; /* the reaper's; counts, as sq_head */
    uint64_t done_tail; /* written under mu, read atomically */
    int32_t *gcount; /* jobs of each group queued or running */
    int low_water;   /* atomic: also wake the loop when no more than this many jobs wait (-1: never) */
    int signalled;   /* atomic: the eventfd was written since the ring was last emptied */
    int efd;
    int nthreads;
    int nice; /* added to each worker's nice value at its start (0: none) */
    pthread_t *threads;
    xxh3_fn xxh3;
};

/* A test harness (tests/c/report_race.c) compiles the pool with AT_TEST_HOOKS and defines
 * this, to hold a worker just after it published a job's end; else it is nothing. */
#ifdef AT_TEST_HOOKS
void at_test_published(struct at_pool *p, int idx);
#define AT_TEST_PUBLISHED(p, idx) at_test_published(p, idx)
#else
#define AT_TEST_PUBLISHED(p, idx) ((void)0)
#endif

/* -- the event count workers park on --------------------------------------------------
 * A waker changes what workers look for (under mu, or in the submission ring), then
 * bumps work_seq; a worker counts itself in work_waiters and reads work_seq before it looks
 * (under mu), and sleeps only while work_seq is unchanged. So a waker either sees the
 * waiter (and wakes it) or the waiter sees its change; a waker with no one parked makes
 * no system call. */
static inline void wake_workers(struct at_pool *p, int n) {
    __atomic_fetch_add(&p->work_seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->work_waiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &p->work_seq, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline int op_state(const struct at_op *op) { return __atomic_load_n(&op->state, __ATOMIC_ACQUIRE); }
static inline void set_state(struct at_op *op, int s) { __atomic_store_n(&op->state, s, __ATOMIC_RELEASE); }

/* With mu held: the slots submitted since the last call go into their priority queues. */
static inline void drain(struct at_pool *p) {
    uint64_t tail = __atomic_load_n(&p->sq_tail, __ATOMIC_ACQUIRE);
    for (; p->sq_head != tail; p->sq_head++) {
        int idx = p->sq[p->sq_head % (uint64_t)p->nops];
        struct at_op *op = &p->ops[idx];
        int prio = op->job.prio;
        if (p->tail[prio] >= 0)
            p->ops[p->tail[prio]].next = idx;
        else
            p->head[prio] = idx;
        p->tail[prio] = idx;
        p->queued++;
        if (op->job.group >= 0) p->gcount[op->job.group]++;
    }
}

/* With mu held: take slot `idx` out of its priority queue. */
AT_HIDDEN void at_unqueue(struct at_pool *p, int idx);

#endif
