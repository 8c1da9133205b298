/* Native I/O workers for the fs and nvme tiers (asynctier.engines.native loads this with ctypes).
 *
 * Why C: from Python threads, each chunk pays the job queue, a thread wake-up and a GIL
 * hand-off per system call, which C threads do not (figures: docs/benchmarks.md). Here a
 * pool of POSIX threads pulls chunk jobs from its own queue and runs each from open to
 * close (plus the xxh3 of the payload) without ever taking the GIL; Python queues jobs
 * ahead and books their outcomes in batches, off the threads' way.
 *
 * Plain C (no Python.h): the pool is driven through ctypes, and the interpreter is never
 * touched from these threads. A job is described by a `struct at_job` (the fs tier's plan
 * of one store, load, spare or unlink: tiers/fs/protocol.py; or the read of one nvme slot:
 * tiers/nvme/fast.py), passed by pointer and copied
 * into a fixed table of `nops` slots owned by the caller's side; a slot is queued by
 * at_submit, run by one worker, and reported once through the completion ring (its index)
 * and the eventfd. The event loop's side never takes the workers' lock: jobs reach them
 * through a submission ring and come back through the completion ring, each published by
 * one atomic index (the loop was blocked for up to ms in calls that took that lock, which
 * the workers, at a higher nice value, take around every job: docs/benchmarks-issue-28.md, issue
 * 28's ninth pass).
 * Anything but the plain case (an error of any kind, a short file) is reported with the
 * step that failed and left to the Python code, which owns error handling. The xxh3
 * function is the system xxHash library's public XXH3_64bits, whose address the caller
 * passes in (dlopen'ed by asynctier.nativeio).
 *
 * The bound: a worker takes one of `tokens` before a job's first system call and gives it
 * back after its last; Python code doing chunk I/O for the same tier outside the pool
 * (its slow paths) takes one too (at_acquire/at_release), so the bound holds for both.
 * Hashing holds no token: there are more workers than tokens, and a write's payload is
 * hashed (and its unnamed file made) ahead of its I/O, a read's payload hashed after it,
 * while other jobs' I/O goes on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_nativeio_pool.h"

/* With mu held, having found nothing to do after reading *seq (counted in work_waiters):
 * sleep until a wake_workers after that read; mu is held again on return. */
static void park_worker(struct at_pool *p, uint32_t seq) {
    pthread_mutex_unlock(&p->mu);
    syscall(SYS_futex, &p->work_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0); /* EAGAIN: bumped already */
    pthread_mutex_lock(&p->mu);
}

#define DO_IO 1   /* a job's system calls, holding a token */
#define DO_POST 2 /* a read's checksum, after its I/O */
#define DO_PREP 3 /* a write's checksums and file, before its I/O */

/* What a worker may do next (with the lock held), in this order: the I/O of the first job
 * in priority order that is ready, if a token is free; a read's checksum; a write's
 * preparation. A group's jobs count one by one: its next to run once prepared, its next to
 * prepare. Returns the slot and sets *what, or -1. */
static int pick(struct at_pool *p, int *what) {
    int prep = -1, ahead = 0;
    drain(p);
    for (int q = 0; q < NPRIO; q++) {
        ahead += p->acq_waiting[q]; /* slow paths of this priority or a higher one */
        for (int i = p->head[q]; i >= 0; i = p->ops[i].next) {
            struct at_op *op = &p->ops[i];
            if (op->job.kind == AT_GROUP) { /* (queued: its sub_io is below its len) */
                if (op->subs[op->sub_io].prep == PREP_NONE && p->ntokens > ahead) {
                    *what = DO_IO;
                    return i;
                }
                if (op->sub_prep < (int32_t)op->job.len && prep < 0) prep = i;
            } else if (op->prep == PREP_NONE) {
                /* a worker that just gave its token back would otherwise take it again at
                 * once, and a slow path waiting in at_acquire could wait for seconds. A
                 * commit takes none: slow paths may hold every token while they wait for it */
                if (p->ntokens > ahead || op->job.kind == AT_COMMIT) {
                    *what = DO_IO;
                    return i;
                }
            } else if (op->prep == PREP_WANTED && prep < 0) {
                prep = i;
            }
        }
    }
    if (p->post_head >= 0) {
        *what = DO_POST;
        return p->post_head;
    }
    *what = DO_PREP;
    return prep;
}

static int acq_total(const struct at_pool *p) {
    int n = 0;
    for (int q = 0; q < NPRIO; q++) n += p->acq_waiting[q];
    return n;
}

/* With the lock held: a token taken (for a job's I/O, or by a slow path). */
static void take_token(struct at_pool *p) {
    p->ntokens--;
    if (++p->in_flight > p->peak) p->peak = p->in_flight;
}

/* With the lock held: a token back; slow paths waiting in at_acquire, of several
 * priorities, are all told (the one whose turn it is must hear of it). */
static void give_token_back(struct at_pool *p) {
    p->in_flight--;
    p->ntokens++;
    if (acq_total(p)) pthread_cond_broadcast(&p->tokens);
}

/* Whether a job of a higher priority than `prio` is queued (a slow path of `prio` lets it go first). */
static int queued_ahead(struct at_pool *p, int prio) {
    drain(p);
    for (int q = 0; q < prio; q++)
        if (p->head[q] >= 0) return 1;
    return 0;
}

void at_unqueue(struct at_pool *p, int idx) {
    int q = p->ops[idx].job.prio, prev = -1;
    for (int i = p->head[q]; i >= 0; prev = i, i = p->ops[i].next) {
        if (i != idx) continue;
        if (prev < 0)
            p->head[q] = p->ops[idx].next;
        else
            p->ops[prev].next = p->ops[idx].next;
        if (p->tail[q] == idx) p->tail[q] = prev;
        break;
    }
    p->queued--;
    /* a slow path of a lower priority waits until no job ahead of it is queued */
    if (p->head[q] < 0 && acq_total(p)) pthread_cond_broadcast(&p->tokens);
    /* stopping: workers parked while jobs were queued must see the queue empty to leave */
    if (p->stopping && p->queued == 0) wake_workers(p, INT_MAX);
}

/* The loop is woken (once until it reaps) when a job of no group ends, when the last job of
 * a group ends (a call's chunks are one group: the call wakes once, not once per chunk), or
 * when the queue runs low while the loop holds more jobs back (low_water). Returns whether
 * the caller is to write the eventfd (wake_loop), after unlocking: the other workers need
 * not wait for that system call. */
static int report(struct at_pool *p, int idx) {
    /* with the lock held (workers push to the ring one at a time). Everything of the slot is
     * read before it is published: from then on the loop may reap it and submit its next
     * job into it (without this lock), and a group read after that was the next job's: the
     * wrong group counted down, and a call whose last end then woke no one hung. */
    int g = p->ops[idx].job.group;
    int wake = g < 0 || --p->gcount[g] == 0 || p->queued <= __atomic_load_n(&p->low_water, __ATOMIC_RELAXED);
    set_state(&p->ops[idx], AT_DONE);
    p->done[p->done_tail % (uint64_t)p->nops] = idx;
    /* sequentially consistent with `signalled` below and in at_reap: a reaper that re-arms
     * the wake-up and then finds the ring empty has not missed this end */
    __atomic_store_n(&p->done_tail, p->done_tail + 1, __ATOMIC_SEQ_CST);
    AT_TEST_PUBLISHED(p, idx);
    /* a loop that reaps before the eventfd is written only gets one spare wake-up */
    return wake && !__atomic_exchange_n(&p->signalled, 1, __ATOMIC_SEQ_CST);
}

static void wake_loop(struct at_pool *p) {
    uint64_t one = 1;
    /* the eventfd counts; a full counter (never, in practice) still leaves it readable */
    ssize_t w = write(p->efd, &one, sizeof one);
    (void)w;
}

/* report() with the lock held, and the eventfd written with it released. */
static void report_unlocked_wake(struct at_pool *p, int idx) {
    if (report(p, idx)) {
        pthread_mutex_unlock(&p->mu);
        wake_loop(p);
        pthread_mutex_lock(&p->mu);
    }
}

/* The list of reads whose I/O is done, to be hashed, holds slots (an entry below nops, its
 * job's own) and groups' jobs (nops + the job's place in subs); each linked by its next. */
static struct at_op *post_op(struct at_pool *p, int entry) {
    return entry < p->nops ? &p->ops[entry] : &p->subs[entry - p->nops];
}

/* With the lock held: a read's checksums to be taken by another worker (FIFO). */
static void post_push(struct at_pool *p, int entry) {
    post_op(p, entry)->next = -1;
    if (p->post_head < 0)
        p->post_head = entry;
    else
        post_op(p, p->post_tail)->next = entry;
    p->post_tail = entry;
}

static void group_job_ended(struct at_pool *p, int idx);

/* With the lock held: a group's first job taken by a worker (to prepare or to run): the
 * group is no longer taken back whole (at_withdraw cuts it), and its own outcome starts afresh. */
static void start_group(struct at_op *op, struct at_res *r) {
    if (op_state(op) == AT_RUNNING) return;
    memset(r, 0, sizeof *r);
    set_state(op, AT_RUNNING);
}

/* A group's next job prepared, holding no token (with the lock held; released around it). */
static void prepare_group_job(struct at_pool *p, int idx) {
    struct at_op *op = &p->ops[idx];
    int s = op->sub_prep++, next = 0;
    struct at_op *sub = &op->subs[s];
    start_group(op, &p->res[idx]);
    sub->prep = PREP_RUNNING;
    if (pick(p, &next) >= 0) wake_workers(p, 1); /* more to do: another worker */
    pthread_mutex_unlock(&p->mu);
    at_prepare_write(p->xxh3, sub, &op->subres[s]);
    pthread_mutex_lock(&p->mu);
    if (sub->prep == PREP_WITHDRAW) { /* its call was cancelled meanwhile (at_withdraw) */
        at_withdraw_job(sub, &op->subres[s], 1);
        sub->prep = PREP_NONE;
        group_job_ended(p, idx);
        return;
    }
    sub->prep = PREP_NONE;
    if (p->ntokens > 0) wake_workers(p, 1);
}

/* A group's next job run, holding a token of its own (with the lock held; released around
 * the I/O), so a group's jobs run on as many workers at once as there are tokens: the loop
 * plans and books one job for a call, and the device still sees every run in flight. The
 * group is reported when its last job ends. */
static void run_group_job(struct at_pool *p, int idx) {
    struct at_op *op = &p->ops[idx];
    int s = op->sub_io++, next = 0;
    struct at_op *sub = &op->subs[s];
    struct at_res *sr = &op->subres[s];
    start_group(op, &p->res[idx]);
    if (op->sub_io == (int32_t)op->job.len) at_unqueue(p, idx); /* every job of it taken */
    take_token(p);
    if (pick(p, &next) >= 0) wake_workers(p, 1);
    pthread_mutex_unlock(&p->mu);

    at_run_job(sub, sr);

    pthread_mutex_lock(&p->mu);
    give_token_back(p);
    int hash = sub->job.hashed && at_read_whole(sub, sr), posted = 0;
    if (hash && p->bound == 1 && p->in_flight == 0 && pick(p, &next) >= 0 && next == DO_IO) {
        /* one token, free, and an I/O ready: its checksums are left to another worker, as a
         * lone read's are, and this one goes on to that I/O, so the device does not wait for
         * a hash and a thread wake-up between two reads (64 KiB loads at depth 1 on tmpfs
         * had lost 18-21 %; docs/benchmarks-issue-28.md, twentieth pass). With more tokens another
         * worker runs the next I/O meanwhile, and handing over cost the loop's thread CPU:
         * fs 64 KiB loads at depth 16 had 3x the p99 lag, at the same GB/s */
        post_push(p, p->nops + (int)(sub - p->subs));
        wake_workers(p, 1);
        hash = 0;
        posted = 1;
    }
    if (hash || op->job.len > 1) {
        /* a read's checksum, with its token back: another worker runs the next I/O. Then
         * the worker offers its CPU before its next job: a group's jobs back to back were
         * one long burst that an event loop woken meanwhile waited behind (fs p99 lag on
         * tmpfs at 256 KiB: loads 4.2 -> 1.3 ms, stores 5.1 -> 2.7; docs/benchmarks-issue-28.md,
         * eleventh pass), and so were reads spread without it (nvme loads on tmpfs at 256
         * KiB: 7-10 ms; nineteenth pass) */
        if (hash && p->queued > 0) wake_workers(p, 1);
        pthread_mutex_unlock(&p->mu);
        if (hash) at_hash_read(p->xxh3, sub, sr);
        if (op->job.len > 1) sched_yield();
        pthread_mutex_lock(&p->mu);
    }
    if (!posted) group_job_ended(p, idx);
}

/* With the lock held: a group's job is over (its checksums taken too): the group is
 * reported when its last one is. */
static void group_job_ended(struct at_pool *p, int idx) {
    struct at_op *op = &p->ops[idx];
    if (--op->sub_left == 0) {
        p->res[idx].result = (int64_t)op->job.len;
        report_unlocked_wake(p, idx);
    }
}

/* A read's checksums taken from the list of reads to hash (with the lock held; released
 * around the hashing), then its end reported: a slot's own, or its group's last. */
static void hash_posted(struct at_pool *p, int entry) {
    struct at_op *op = post_op(p, entry);
    int next = 0;
    p->post_head = op->next;
    if (pick(p, &next) >= 0) wake_workers(p, 1);
    pthread_mutex_unlock(&p->mu);
    if (entry < p->nops) {
        at_hash_read(p->xxh3, op, &p->res[entry]);
        pthread_mutex_lock(&p->mu);
        report_unlocked_wake(p, entry);
        return;
    }
    int sub = entry - p->nops, idx = sub / GROUP_MAX;
    at_hash_read(p->xxh3, op, &p->ops[idx].subres[sub % GROUP_MAX]);
    pthread_mutex_lock(&p->mu);
    group_job_ended(p, idx);
}

/* One loop for the three kinds of work (I/O, a read's checksum, a write's preparation):
 * they are picked under one lock in one order (pick), so it reads best in one place. */
static void *worker(void *arg) {
    struct at_pool *p = arg;
    (void)pthread_setname_np(pthread_self(), "asynctier-nio"); /* for top, perf and tests */
    /* below the event-loop thread: on a machine with fewer cores than workers, the loop's
     * thread then wins the CPU when it wakes (best effort; a failure changes nothing) */
    if (p->nice > 0) {
        errno = 0;
        int now = getpriority(PRIO_PROCESS, (id_t)gettid());
        if (errno == 0) (void)setpriority(PRIO_PROCESS, (id_t)gettid(), now + p->nice);
    }
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int what = 0, next_what = 0, idx;
        /* stopping: the queued jobs still run (their callers wait for them) */
        while ((idx = pick(p, &what)) < 0 && !(p->stopping && p->queued == 0 && p->post_head < 0)) {
            __atomic_fetch_add(&p->work_waiters, 1, __ATOMIC_SEQ_CST);
            uint32_t seq = __atomic_load_n(&p->work_seq, __ATOMIC_SEQ_CST);
            if ((idx = pick(p, &what)) < 0 && !(p->stopping && p->queued == 0 && p->post_head < 0))
                park_worker(p, seq);
            __atomic_fetch_sub(&p->work_waiters, 1, __ATOMIC_SEQ_CST);
            if (idx >= 0) break;
        }
        if (idx < 0) {
            wake_workers(p, INT_MAX); /* the others may be parked on what just ended */
            break;
        }
        if (what == DO_POST) {
            hash_posted(p, idx);
            continue;
        }
        struct at_op *op = &p->ops[idx];
        struct at_res *r = &p->res[idx];
        if (op->job.kind == AT_GROUP) {
            if (what == DO_PREP)
                prepare_group_job(p, idx);
            else
                run_group_job(p, idx);
            continue;
        }
        if (what == DO_PREP) {
            /* holding no token: at depth 1 the previous chunk's I/O goes on meanwhile */
            op->prep = PREP_RUNNING;
            set_state(op, AT_RUNNING); /* taken back only as at_withdraw says */
            if (pick(p, &next_what) >= 0) wake_workers(p, 1); /* more to do: another worker */
            pthread_mutex_unlock(&p->mu);
            memset(r, 0, sizeof *r);
            at_prepare_write(p->xxh3, op, r);
            pthread_mutex_lock(&p->mu);
            if (op->prep == PREP_WITHDRAW) { /* its call was cancelled meanwhile (at_withdraw) */
                at_unqueue(p, idx);
                at_withdraw_job(op, r, 1); /* reported: a file handed over is closed, as a failed write's */
                op->prep = PREP_NONE;
                report_unlocked_wake(p, idx);
                continue;
            }
            op->prep = PREP_NONE;
            if (p->ntokens > 0) wake_workers(p, 1);
            continue;
        }
        if (op_state(op) != AT_RUNNING) memset(r, 0, sizeof *r); /* not prepared above */
        at_unqueue(p, idx);
        set_state(op, AT_RUNNING);
        int token = op->job.kind != AT_COMMIT;
        if (token) take_token(p);
        int next = 0;
        if (pick(p, &next) >= 0) wake_workers(p, 1); /* more to do: another worker */
        pthread_mutex_unlock(&p->mu);

        at_run_job(op, r);

        pthread_mutex_lock(&p->mu);
        if (token) give_token_back(p);
        if (op->job.hashed && at_read_whole(op, r)) {
            /* its checksum is left to another worker: this one goes on to the next I/O at
             * once, without a thread wake-up between the two. At any depth, unlike a group's
             * read (run_group_job): under the group's rule one-chunk loads measured lower at
             * 7 of 8 points, depths 1 and 16, at the same lag (docs/benchmarks-issue-28.md,
             * twenty-first pass) */
            post_push(p, idx);
            wake_workers(p, 1);
        } else {
            report_unlocked_wake(p, idx);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* With the lock held: whether slot `idx` is in its priority queue. */
static int in_queue(const struct at_pool *p, int idx) {
    for (int i = p->head[p->ops[idx].job.prio]; i >= 0; i = p->ops[i].next)
        if (i == idx) return 1;
    return 0;
}

/* Take back what no worker has begun the I/O of, of the job in slot `idx` (its call is
 * cancelled). A job whose I/O has not begun is withdrawn: a queued one whole, as at_cancel
 * (1: it never runs nor is reported); one prepared already, the same once what its
 * preparation made is undone (at_withdraw_job; 1); one being prepared, once prepared: it is
 * then reported with stage ST_WITHDRAWN (2). Of a GROUP begun, the jobs not run are withdrawn
 * (those being prepared once prepared), and the group is reported once its other jobs have
 * ended (2), or now if they have (3: the caller reaps). 0: nothing was left to take. */
int at_withdraw(struct at_pool *p, int idx) {
    if (idx < 0 || idx >= p->nops) return 0;
    pthread_mutex_lock(&p->mu);
    drain(p);
    struct at_op *op = &p->ops[idx];
    int rc = 0, st = op_state(op);
    if (st == AT_QUEUED) {
        at_unqueue(p, idx);
        if (op->job.group >= 0) p->gcount[op->job.group]--;
        set_state(op, AT_IDLE);
        rc = 1;
    } else if (st == AT_RUNNING && op->job.kind != AT_GROUP && op->job.kind != AT_COMMIT) {
        if (op->prep == PREP_RUNNING) {
            op->prep = PREP_WITHDRAW; /* (the worker preparing it ends it) */
            rc = 2;
        } else if (op->prep == PREP_NONE && in_queue(p, idx)) { /* prepared, its I/O not begun */
            at_unqueue(p, idx);
            at_withdraw_job(op, &p->res[idx], 0); /* never reported: a file handed over stays the caller's */
            if (op->job.group >= 0) p->gcount[op->job.group]--;
            set_state(op, AT_IDLE);
            rc = 1;
        }
    } else if (st == AT_RUNNING && op->job.kind == AT_GROUP && op->sub_io < (int32_t)op->job.len) {
        int32_t len = (int32_t)op->job.len, cut = op->sub_io, later = 0;
        for (int32_t s = cut; s < len; s++) {
            if (op->subs[s].prep == PREP_RUNNING) {
                op->subs[s].prep = PREP_WITHDRAW; /* (the worker preparing it ends it) */
                later++;
            } else {
                at_withdraw_job(&op->subs[s], &op->subres[s], 1);
            }
        }
        op->job.len = (size_t)cut;
        if (op->sub_prep > cut) op->sub_prep = cut;
        at_unqueue(p, idx); /* none left to run */
        op->sub_left -= len - cut - later;
        rc = 2;
        if (op->sub_left == 0) { /* every job begun has ended: reported here */
            p->res[idx].result = cut;
            int wake = report(p, idx);
            pthread_mutex_unlock(&p->mu);
            if (wake) wake_loop(p);
            return 3;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void at_free(struct at_pool *p);

/* A pool of `nthreads` workers sharing `ntokens` I/O tokens, with `nops` job slots, hashing
 * with `xxh3` (XXH3_64bits). Workers raise their nice value by `nice` (>= 0).
 * Returns NULL with errno set on failure. */
struct at_pool *at_new(int nthreads, int ntokens, int nops, xxh3_fn xxh3, int nice) {
    if (nthreads < 1 || ntokens < 1 || nops < 1 || nice < 0 || !xxh3) {
        errno = EINVAL;
        return NULL;
    }
    struct at_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->efd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->sub_mu, NULL);
    pthread_cond_init(&p->tokens, NULL);
    for (int q = 0; q < NPRIO; q++) p->head[q] = p->tail[q] = -1;
    p->post_head = p->post_tail = -1;
    p->ntokens = p->bound = ntokens;
    p->nops = nops;
    p->low_water = -1;
    p->xxh3 = xxh3;
    p->nice = nice;
    p->ops = calloc((size_t)nops, sizeof *p->ops);
    p->res = calloc((size_t)nops, sizeof *p->res);
    p->done = calloc((size_t)nops, sizeof *p->done);
    p->sq = calloc((size_t)nops, sizeof *p->sq);
    p->gcount = calloc((size_t)nops, sizeof *p->gcount);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->subs = calloc((size_t)nops * GROUP_MAX, sizeof *p->subs);
    p->subres = calloc((size_t)nops * GROUP_MAX, sizeof *p->subres);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!p->ops || !p->res || !p->done || !p->sq || !p->gcount || !p->threads || !p->subs || !p->subres || p->efd < 0) {
        int e = errno ? errno : ENOMEM;
        at_free(p);
        errno = e;
        return NULL;
    }
    for (int i = 0; i < nops; i++) {
        p->ops[i].subs = &p->subs[(size_t)i * GROUP_MAX];
        p->ops[i].subres = &p->subres[(size_t)i * GROUP_MAX];
    }
    for (int i = 0; i < nthreads; i++) {
        int e = pthread_create(&p->threads[i], NULL, worker, p);
        if (e != 0) {
            at_free(p); /* stops and joins the ones started */
            errno = e;
            return NULL;
        }
        p->nthreads++;
    }
    return p;
}

int at_eventfd(struct at_pool *p) { return p->efd; }
struct at_res *at_results(struct at_pool *p) { return p->res; }
/* The outcomes of the sub-jobs of AT_GROUP jobs: GROUP_MAX per slot, slot by slot. */
struct at_res *at_group_results(struct at_pool *p) { return p->subres; }
uint64_t at_hash(struct at_pool *p, const void *buf, size_t len) { return p->xxh3(buf, len); }

/* What this build was compiled with, checked by asynctier/engines/native_lib.py against
 * descriptors.py: a library left from another version would read and write its tables with
 * another layout. */
int at_group_max(void) { return GROUP_MAX; }
size_t at_job_size(void) { return sizeof(struct at_job); }

/* at_acquire without waiting: 0 when a token is free for `prio` now (no waiter of the same or
 * a higher priority and no queued job of a higher one is owed it), else -EAGAIN (also while
 * a worker holds the pool's lock); -EINVAL, -ESHUTDOWN. Never blocks: the caller holds the
 * GIL, and a worker preempted while holding the lock would hold up every Python thread. */
int at_try_acquire(struct at_pool *p, int prio) {
    if (prio < 0 || prio >= NPRIO) return -EINVAL;
    if (pthread_mutex_trylock(&p->mu) != 0) return -EAGAIN; /* the caller waits in at_acquire */
    int ahead = 0;
    for (int q = 0; q <= prio; q++) ahead += p->acq_waiting[q];
    int rc = -EAGAIN;
    if (p->stopping)
        rc = -ESHUTDOWN;
    else if (p->ntokens > ahead && !queued_ahead(p, prio)) {
        take_token(p);
        rc = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* A token for chunk I/O of priority `prio` done outside the pool (blocks until one is free
 * and no job of a higher priority is queued: a slow path of stores lets queued loads go
 * first; one of priority 0 goes ahead of every queued job); 0, -EINVAL, or -ESHUTDOWN. */
int at_acquire(struct at_pool *p, int prio) {
    if (prio < 0 || prio >= NPRIO) return -EINVAL;
    pthread_mutex_lock(&p->mu);
    p->acq_waiting[prio]++;
    while ((p->ntokens == 0 || queued_ahead(p, prio)) && !p->stopping) pthread_cond_wait(&p->tokens, &p->mu);
    p->acq_waiting[prio]--;
    int rc = -ESHUTDOWN;
    if (p->ntokens > 0 && !p->stopping) { /* as at_try_acquire: none once the pool is told to stop */
        take_token(p);
        rc = 0;
    }
    /* tokens left: queued jobs may use them (pick says which) */
    if (p->ntokens > 0 && p->queued > 0) wake_workers(p, 1);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* With the lock held: a token back from a slow path. */
static void release_locked(struct at_pool *p) {
    give_token_back(p);
    if (p->queued > 0) wake_workers(p, 1);
}

void at_release(struct at_pool *p) {
    pthread_mutex_lock(&p->mu);
    release_locked(p);
    pthread_mutex_unlock(&p->mu);
}

/* at_release without waiting (for a caller holding the GIL): 0, or -EAGAIN while a worker
 * holds the pool's lock, and the token is still out (the caller then calls at_release
 * without the GIL). */
int at_try_release(struct at_pool *p) {
    if (pthread_mutex_trylock(&p->mu) != 0) return -EAGAIN;
    release_locked(p);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* counts: [0] in flight, [1] peak in flight, [2] queued, [3] threads waiting in at_acquire */
void at_counts(struct at_pool *p, int32_t *out) {
    pthread_mutex_lock(&p->mu);
    drain(p);
    out[0] = p->in_flight;
    out[1] = p->peak;
    out[2] = p->queued;
    out[3] = acq_total(p);
    pthread_mutex_unlock(&p->mu);
}

/* No new jobs; workers end once the queue is empty. Does not wait. */
void at_shutdown(struct at_pool *p) {
    /* a batch submitted before this is in the ring before the workers see `stopping` (they
     * drain it, and run it, before they leave); one after it is refused */
    pthread_mutex_lock(&p->sub_mu);
    p->sub_closed = 1;
    pthread_mutex_unlock(&p->sub_mu);
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->tokens);
    pthread_mutex_unlock(&p->mu);
    wake_workers(p, INT_MAX);
}

/* Stop, join the workers (they finish the queued jobs first), free everything. Blocks. */
void at_free(struct at_pool *p) {
    if (!p) return;
    at_shutdown(p);
    for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    if (p->efd >= 0) close(p->efd);
    pthread_cond_destroy(&p->tokens);
    pthread_mutex_destroy(&p->sub_mu);
    pthread_mutex_destroy(&p->mu);
    free(p->ops);
    free(p->res);
    free(p->done);
    free(p->sq);
    free(p->gcount);
    free(p->subs);
    free(p->subres);
    free(p->threads);
    free(p);
}
