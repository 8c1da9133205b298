/* The event loop's side of the native workers' pool (_nativeio.c): jobs go in through the
 * submission ring, their ends come back through the completion ring, and neither waits for
 * the workers' lock (only at_cancel and at_withdraw, rare, take it). One thread submits and
 * reaps at a time: the loop's. Why rings and not the lock: docs/benchmarks-issue-28.md, issue 28's ninth pass. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_nativeio_pool.h"

static int job_ok(const struct at_pool *p, int idx, const struct at_job *j);

static int is_read(int kind) { return kind == AT_READ || kind == AT_READV; }

/* The sub-jobs of an AT_GROUP job: files or runs of slab slots read, or files written or
 * recycled or runs of slots written, each a valid job (one kind of I/O a group: a call's
 * loads, or its stores). */
static int group_ok(const struct at_pool *p, int idx, const struct at_job *j) {
    if (!j->hb || j->len < 1 || j->len > GROUP_MAX || j->hb_len != j->len) return 0;
    const struct at_job *sub = j->hb;
    int reads = is_read(sub[0].kind);
    for (size_t i = 0; i < j->len; i++) {
        int k = sub[i].kind;
        if ((reads ? !is_read(k) : k != AT_WRITE && k != AT_RECYCLE && k != AT_WRITEV) || !job_ok(p, idx, &sub[i]))
            return 0;
    }
    return 1;
}

static int job_ok(const struct at_pool *p, int idx, const struct at_job *j) {
    if (idx < 0 || idx >= p->nops || j->prio < 0 || j->prio >= NPRIO || j->kind < AT_READ || j->kind > AT_GROUP ||
        j->group < -1 || j->group >= p->nops)
        return 0;
    if (j->kind == AT_GROUP) return group_ok(p, idx, j);
    int vec = j->kind == AT_READV || j->kind == AT_WRITEV;
    if (vec && (j->fd < 0 || !j->hb || !j->buf || j->len < 1 || j->len > READV_MAX || j->hb_len != 2 * j->len))
        return 0;
    if (!memchr(j->name, 0, NAME_MAX_LEN) || !memchr(j->name2, 0, NAME_MAX_LEN) || !memchr(j->name3, 0, NAME_MAX_LEN))
        return 0;
    if (j->kind == AT_COMMIT)
        return j->fd >= 0 && j->hb_len <= COMMIT_FDS_MAX && (!j->hb_len || j->hb) && (!j->len || j->buf);
    if (j->kind == AT_WRITEV) { /* every header block holds the header and its checksum */
        const struct iovec *v = j->hb;
        if (j->body_len < CSUM_OFFSET + 8) return 0;
        for (size_t i = 0; i < j->len; i++)
            if ((size_t)j->body_len + 8 > v[2 * i].iov_len) return 0;
    } else if (j->body_len > 0 && (size_t)j->body_len + 8 > j->hb_len) {
        return 0;
    }
    /* a write's preparation fills in the header's payload checksum at CSUM_OFFSET */
    if ((j->kind == AT_WRITE || j->kind == AT_RECYCLE) && j->body_len > 0 && (j->body_len < CSUM_OFFSET + 8 || !j->hb))
        return 0;
    if (j->kind == AT_SPARE && !j->name2[0]) return 0;
    if (j->kind == AT_RECYCLE && (!j->name2[0] || !j->name3[0])) return 0;
    return 1;
}

/* With sub_mu held: fill slot `idx` for `j` (checked by job_ok) and put it in the
 * submission ring at *tail (published by the caller); 0 or -errno. The slot is idle: no
 * worker looks at it until it is drained. */
static int queue_job(struct at_pool *p, int idx, const struct at_job *j, uint64_t *tail) {
    struct at_op *op = &p->ops[idx];
    if (p->sub_closed) return -ESHUTDOWN;
    if (op_state(op) != AT_IDLE) return -EBUSY;
    op->job = *j;
    op->prep = j->kind == AT_WRITE || j->kind == AT_RECYCLE || j->kind == AT_WRITEV ? PREP_WANTED : PREP_NONE;
    if (j->kind == AT_GROUP) { /* copied, as the job itself is: the caller may reuse its table */
        const struct at_job *sub = j->hb;
        int reads = is_read(sub[0].kind); /* (group_ok: all reads, or all writes) */
        op->job.hashed = 0; /* each read's own checksum, by the worker that ran it */
        op->prep = PREP_NONE;
        for (size_t i = 0; i < j->len; i++) {
            op->subs[i].job = sub[i];
            op->subs[i].fd = -1;
            /* the writes' checksums (and new files), each before its own I/O */
            op->subs[i].prep = reads ? PREP_NONE : PREP_WANTED;
            memset(&op->subres[i], 0, sizeof op->subres[i]);
        }
        op->sub_prep = reads ? (int32_t)j->len : 0;
        op->sub_io = 0;
        op->sub_left = (int32_t)j->len;
    }
    op->fd = -1;
    op->next = -1;
    set_state(op, AT_QUEUED);
    p->sq[*tail % (uint64_t)p->nops] = idx;
    ++*tail;
    return 0;
}

/* Queue slot `idx` (idle) for the job `j` (copied: the caller may reuse it at once):
 *   AT_READ    openat(dfd, name, flags), preadv of hb and buf (EOF ends it short), close;
 *              the xxh3 of buf if `hashed`;
 *   AT_WRITE   the file `fd`, or a new one: O_TMPFILE in dfd with flags, or, with `name2`,
 *              name2 in dfd2 created O_EXCL; pwritev of hb and buf, [fdatasync], published
 *              under `name` in dfd by linkat (no name2) or renameat of name2, [fsync of dfd].
 *              `fd` is left open (closed too with AT_MODE_CLOSE in `mode`), a new file closed. body_len > 0: the header's checksums
 *              are filled in first;
 *   AT_SPARE   openat(dfd, name, flags), its permission bits made `mode` (if not 0 and
 *              they differ), renameat to name2 in dfd2: the result is the descriptor (a
 *              failed rename closes it);
 *   AT_UNLINK  unlinkat(dfd, name);
 *   AT_RECYCLE openat(dfd2, name2, flags), `mode` as AT_SPARE's, renameat to name3 in dfd,
 *              then only if no one but the lock descriptor `fd` holds the namespace lock:
 *              pwritev of hb and buf
 *              (checksums filled in as AT_WRITE's), [fdatasync], renameat of name3 to name
 *              in dfd, [fsync of dfd]; info = 1 when a failure left the file at name3;
 *   AT_READV   preadv of a run of slots of the open file `fd` at `off` (see _nativeio.h);
 *   AT_WRITEV  pwritev of a run of slots, each header's checksums filled in first;
 *   AT_COMMIT  [fdatasync of the descriptors at hb], pwrite of buf at off of fd, [fdatasync];
 *   AT_GROUP   the jobs at hb (len of them: reads and slot reads, or writes, recycles and
 *              slot writes), each as if alone, spread over the workers (each holding a
 *              token), reported once when the last ends, their outcomes in at_group_results.
 * Returns 0, or -EINVAL (bad slot or job), -EBUSY (slot in use), -ESHUTDOWN. */
int at_submit_many(struct at_pool *p, int n, const int32_t *idx, const struct at_job *jobs);

int at_submit(struct at_pool *p, int idx, const struct at_job *j) {
    int rc = at_submit_many(p, 1, &idx, j);
    return rc == 1 ? 0 : rc;
}

/* Queue `n` jobs at once, `jobs[i]` into slot `idx[i]` (a call's chunks reach the workers
 * together, and the loop pays one call for them). The first job refused (as at_submit
 * would refuse it) stops the batch: returns how many were queued before it, or its -errno
 * if it is the first. Never waits for the workers (their lock is not taken): call it from
 * one thread at a time, the event loop's, for the fastest path. */
int at_submit_many(struct at_pool *p, int n, const int32_t *idx, const struct at_job *jobs) {
    int done = 0, rc = 0;
    pthread_mutex_lock(&p->sub_mu);
    uint64_t tail = p->sq_tail;
    for (; done < n; done++) {
        rc = job_ok(p, idx[done], &jobs[done]) ? queue_job(p, idx[done], &jobs[done], &tail) : -EINVAL;
        if (rc != 0) break;
    }
    __atomic_store_n(&p->sq_tail, tail, __ATOMIC_RELEASE); /* the batch, to the workers at once */
    pthread_mutex_unlock(&p->sub_mu);
    /* one worker: each that finds more to do wakes the next (worker()), so the loop's
     * thread pays one wake-up per batch, not one per parked worker as a broadcast would */
    if (done > 0) wake_workers(p, 1);
    return done > 0 ? done : rc;
}

/* Take back a queued job: 1 if taken (it will never run nor be reported; the slot is idle
 * again), 0 if it is running or done already (it will be, or was, reported). */
int at_cancel(struct at_pool *p, int idx) {
    if (idx < 0 || idx >= p->nops) return 0;
    pthread_mutex_lock(&p->mu);
    drain(p); /* a job still in the submission ring is queued first, then taken back */
    int taken = 0;
    struct at_op *op = &p->ops[idx];
    if (op_state(op) == AT_QUEUED) { /* not being hashed, not started */
        at_unqueue(p, idx);
        if (op->job.group >= 0) p->gcount[op->job.group]--;
        set_state(op, AT_IDLE);
        taken = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return taken;
}

/* Up to `max` slots whose jobs ended since the last call, into `out`; each becomes idle
 * (its result stays readable in at_results until it is submitted again). Never waits for
 * the workers; one thread reaps (the event loop's). */
int at_reap(struct at_pool *p, int32_t *out, int max) {
    int n = 0;
    for (;;) {
        uint64_t tail = __atomic_load_n(&p->done_tail, __ATOMIC_SEQ_CST);
        for (; n < max && p->done_head != tail; p->done_head++) {
            int idx = p->done[p->done_head % (uint64_t)p->nops];
            set_state(&p->ops[idx], AT_IDLE);
            out[n++] = idx;
        }
        if (n == max) return n; /* the caller comes back for the rest */
        /* emptied: the next end to report writes the eventfd again; one reported before
         * this store saw the flag set and wrote nothing, so look once more */
        __atomic_store_n(&p->signalled, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&p->done_tail, __ATOMIC_SEQ_CST) == p->done_head) return n;
    }
}

/* Empty the eventfd before reaping; nonblocking, it never waits. The loop calls it keeping
 * the GIL: os.read gives the GIL up for the syscall, and a thread taking it then (a
 * checkpoint's steps) can keep the loop waiting up to a switch interval to get it back (no
 * change measured either way: docs/benchmarks-issue-28.md, twenty-fourth pass). */
void at_clear(struct at_pool *p) {
    uint64_t v;
    ssize_t r = read(p->efd, &v, sizeof v);
    (void)r; /* EAGAIN: nothing was written since the last read */
}

/* Wake the loop when no more than `n` jobs wait for a token (-1: only as report says): the
 * loop holds more jobs back and would top the queue up. */
void at_set_low_water(struct at_pool *p, int n) { __atomic_store_n(&p->low_water, n, __ATOMIC_RELAXED); }

