/* Native I/O workers for the fs tier (asynctier.nativeio loads this with ctypes).
 *
 * Why C: from Python threads, each chunk pays the job queue, a thread wake-up and a GIL
 * hand-off per system call; over the fs tier's own files, C threads doing the same calls
 * read 1.07-1.25x faster than fio where Python threads reached 0.93-1.16x and the tier
 * 0.66-0.82x (bench/README.md, "fs tier"). Here a pool of POSIX threads pulls chunk jobs
 * from its own queue and runs each from open to close (plus the xxh3 of the payload)
 * without ever taking the GIL; Python queues jobs ahead and books their outcomes in
 * batches, off the threads' way.
 *
 * Plain C (no Python.h): the pool is driven through ctypes, and the interpreter is never
 * touched from these threads. Jobs live in a fixed table of `nops` slots owned by the
 * caller's side; a slot is queued by at_submit, run by one worker, and reported once
 * through the completion ring (its index) and the eventfd. Anything but the plain case
 * (an error of any kind, a short file) is reported with the step that failed and left to
 * the Python code, which owns error handling.
 *
 * The bound: a worker takes one of `tokens` before a job's first system call and gives it
 * back after its last; Python code doing chunk I/O for the same tier outside the pool
 * (its slow paths) takes one too (at_acquire/at_release), so the bound holds for both.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#define AT_READ 1
#define AT_WRITE 2

#define AT_QUEUED 1
#define AT_RUNNING 2
#define AT_DONE 3
#define AT_IDLE 0

/* the step a job failed at (res.stage); 0: none */
#define ST_OPEN 1
#define ST_IO 2
#define ST_DATASYNC 3
#define ST_LINK 4
#define ST_DIRSYNC 5

#define NPRIO 4
#define NAME_MAX_LEN 256
#define CSUM_OFFSET 20 /* of the payload checksum in a packed header (asynctier.integrity) */

typedef uint64_t (*xxh3_fn)(const void *, size_t);

/* What Python reads back; one per slot, laid out as nativeio._Result. */
struct at_res {
    int64_t result;  /* bytes moved, or -errno of the failed step */
    uint64_t csum;   /* xxh3-64 of the payload (reads that got it all; writes) */
    int32_t stage;   /* ST_* of the failure, 0 if none */
    int32_t info;    /* writes: 1 if the name was taken already (EEXIST on link) */
};

struct at_op {
    int32_t kind, prio, state, dfd, flags, pre_fd, sync, body_len, hashed;
    int32_t next; /* queue link */
    char name[NAME_MAX_LEN];
    char *hb;
    size_t hb_len;
    char *buf;
    size_t len;
};

struct at_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;   /* a job queued, a token freed, or stopping */
    pthread_cond_t tokens; /* a token freed (for at_acquire) */
    int head[NPRIO], tail[NPRIO];
    int queued;
    int ntokens, in_flight, peak;
    int stopping;
    int nops;
    struct at_op *ops;
    struct at_res *res;
    int32_t *done; /* completion ring of slot indices */
    int done_head, done_count;
    int efd;
    int nthreads;
    pthread_t *threads;
    xxh3_fn xxh3;
};

static int64_t move_all(int fd, int write, struct iovec *iov, int cnt, size_t total) {
    /* one preadv/pwritev for the whole chunk; loops on short transfers (EOF ends a read) */
    size_t done = 0;
    while (done < total) {
        ssize_t n = write ? pwritev(fd, iov, cnt, (off_t)done) : preadv(fd, iov, cnt, (off_t)done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) {
            if (write) return -EIO; /* a write that makes no progress */
            break;
        }
        done += (size_t)n;
        size_t k = (size_t)n;
        while (cnt > 0 && k >= iov->iov_len) {
            k -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
        }
    }
    return (int64_t)done;
}

static void put_u64le(char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (char)(v >> (8 * i));
}

static void run_read(struct at_pool *p, struct at_op *op, struct at_res *r) {
    int fd = openat(op->dfd, op->name, op->flags | O_CLOEXEC);
    if (fd < 0) {
        r->result = -errno;
        r->stage = ST_OPEN;
        return;
    }
    struct iovec iov[2] = {{op->hb, op->hb_len}, {op->buf, op->len}};
    int64_t got = move_all(fd, 0, iov, 2, op->hb_len + op->len);
    close(fd);
    r->result = got;
    if (got < 0) {
        r->stage = ST_IO;
        return;
    }
    if (p->xxh3 && op->hashed && (size_t)got == op->hb_len + op->len) r->csum = p->xxh3(op->buf, op->len);
}

static void run_write(struct at_pool *p, struct at_op *op, struct at_res *r) {
    if (op->body_len > 0) {
        /* the header was packed with a zero checksum: put the payload's in, then the
         * header's own checksum over its body (see asynctier.integrity.pack_header) */
        uint64_t c = p->xxh3(op->buf, op->len);
        put_u64le(op->hb + CSUM_OFFSET, c);
        put_u64le(op->hb + op->body_len, p->xxh3(op->hb, (size_t)op->body_len));
        r->csum = c;
    }
    int fd = op->pre_fd;
    if (fd < 0) {
        fd = openat(op->dfd, ".", O_TMPFILE | op->flags | O_CLOEXEC, 0644);
        if (fd < 0) {
            r->result = -errno;
            r->stage = ST_OPEN;
            return;
        }
    }
    struct iovec iov[2] = {{op->hb, op->hb_len}, {op->buf, op->len}};
    int64_t n = move_all(fd, 1, iov, 2, op->hb_len + op->len);
    int stage = 0;
    int64_t err = 0;
    if (n < 0) {
        stage = ST_IO;
        err = n;
    } else if (op->sync && fdatasync(fd) != 0) {
        stage = ST_DATASYNC;
        err = -errno;
    } else {
        char path[48];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, path, op->dfd, op->name, AT_SYMLINK_FOLLOW) != 0) {
            if (errno == EEXIST)
                r->info = 1; /* another writer published this key first: its copy stays */
            else {
                stage = ST_LINK;
                err = -errno;
            }
        }
    }
    if (op->pre_fd < 0) close(fd); /* a file made ahead is the caller's to close */
    if (!stage && op->sync && fsync(op->dfd) != 0) {
        stage = ST_DIRSYNC;
        err = -errno;
    }
    r->stage = stage;
    r->result = stage ? err : n;
}

static void *worker(void *arg) {
    struct at_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        /* stopping: the queued jobs still run (their callers wait for them) */
        while (!(p->queued > 0 && p->ntokens > 0) && !(p->stopping && p->queued == 0))
            pthread_cond_wait(&p->work, &p->mu);
        if (p->queued == 0) break;
        int idx = -1;
        for (int q = 0; q < NPRIO; q++) {
            if (p->head[q] >= 0) {
                idx = p->head[q];
                p->head[q] = p->ops[idx].next;
                if (p->head[q] < 0) p->tail[q] = -1;
                break;
            }
        }
        struct at_op *op = &p->ops[idx];
        op->state = AT_RUNNING;
        p->queued--;
        p->ntokens--;
        if (++p->in_flight > p->peak) p->peak = p->in_flight;
        pthread_mutex_unlock(&p->mu);

        struct at_res *r = &p->res[idx];
        memset(r, 0, sizeof *r);
        if (op->kind == AT_READ)
            run_read(p, op, r);
        else
            run_write(p, op, r);

        pthread_mutex_lock(&p->mu);
        op->state = AT_DONE;
        p->in_flight--;
        p->ntokens++;
        p->done[(p->done_head + p->done_count) % p->nops] = idx;
        p->done_count++;
        pthread_cond_signal(&p->tokens);
        if (p->queued > 0) pthread_cond_signal(&p->work);
        uint64_t one = 1;
        /* the eventfd counts; a full counter (never, in practice) still leaves it readable */
        ssize_t w = write(p->efd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void at_free(struct at_pool *p);

/* A pool of `nthreads` workers sharing `ntokens` I/O tokens, with `nops` job slots.
 * `xxh3` may be NULL (then Python hashes). Returns NULL with errno set on failure. */
struct at_pool *at_new(int nthreads, int ntokens, int nops, xxh3_fn xxh3) {
    if (nthreads < 1 || ntokens < 1 || nops < 1) {
        errno = EINVAL;
        return NULL;
    }
    struct at_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->efd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->tokens, NULL);
    for (int q = 0; q < NPRIO; q++) p->head[q] = p->tail[q] = -1;
    p->ntokens = ntokens;
    p->nops = nops;
    p->xxh3 = xxh3;
    p->ops = calloc((size_t)nops, sizeof *p->ops);
    p->res = calloc((size_t)nops, sizeof *p->res);
    p->done = calloc((size_t)nops, sizeof *p->done);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!p->ops || !p->res || !p->done || !p->threads || p->efd < 0) {
        int e = errno ? errno : ENOMEM;
        at_free(p);
        errno = e;
        return NULL;
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
int at_has_xxh3(struct at_pool *p) { return p->xxh3 != NULL; }

/* Queue slot `idx` (idle). For a write with body_len > 0 the pool must have xxh3.
 * Returns 0, or -EINVAL (bad slot or arguments), -EBUSY (slot in use), -ESHUTDOWN. */
int at_submit(struct at_pool *p, int idx, int kind, int prio, int dfd, const char *name, int flags, int pre_fd,
              int sync, void *hb, size_t hb_len, void *buf, size_t len, int body_len, int hashed) {
    if (idx < 0 || idx >= p->nops || prio < 0 || prio >= NPRIO || (kind != AT_READ && kind != AT_WRITE))
        return -EINVAL;
    if (strlen(name) >= NAME_MAX_LEN || (body_len > 0 && (!p->xxh3 || (size_t)body_len + 8 > hb_len)))
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    struct at_op *op = &p->ops[idx];
    if (p->stopping)
        rc = -ESHUTDOWN;
    else if (op->state != AT_IDLE)
        rc = -EBUSY;
    if (rc == 0) {
        op->kind = kind;
        op->prio = prio;
        op->dfd = dfd;
        op->flags = flags;
        op->pre_fd = pre_fd;
        op->sync = sync;
        op->body_len = body_len;
        op->hashed = hashed;
        strcpy(op->name, name);
        op->hb = hb;
        op->hb_len = hb_len;
        op->buf = buf;
        op->len = len;
        op->next = -1;
        op->state = AT_QUEUED;
        if (p->tail[prio] >= 0)
            p->ops[p->tail[prio]].next = idx;
        else
            p->head[prio] = idx;
        p->tail[prio] = idx;
        p->queued++;
        pthread_cond_signal(&p->work);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Take back a queued job: 1 if taken (it will never run nor be reported; the slot is idle
 * again), 0 if it is running or done already (it will be, or was, reported). */
int at_cancel(struct at_pool *p, int idx) {
    if (idx < 0 || idx >= p->nops) return 0;
    pthread_mutex_lock(&p->mu);
    int taken = 0;
    struct at_op *op = &p->ops[idx];
    if (op->state == AT_QUEUED) {
        int q = op->prio, prev = -1;
        for (int i = p->head[q]; i >= 0; prev = i, i = p->ops[i].next) {
            if (i != idx) continue;
            if (prev < 0)
                p->head[q] = op->next;
            else
                p->ops[prev].next = op->next;
            if (p->tail[q] == idx) p->tail[q] = prev;
            break;
        }
        op->state = AT_IDLE;
        p->queued--;
        taken = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return taken;
}

/* Up to `max` slots whose jobs ended since the last call, into `out`; each becomes idle
 * (its result stays readable in at_results until it is submitted again). */
int at_reap(struct at_pool *p, int32_t *out, int max) {
    pthread_mutex_lock(&p->mu);
    int n = 0;
    while (n < max && p->done_count > 0) {
        int idx = p->done[p->done_head];
        p->done_head = (p->done_head + 1) % p->nops;
        p->done_count--;
        p->ops[idx].state = AT_IDLE;
        out[n++] = idx;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* A token for chunk I/O done outside the pool (blocks until one is free); 0, or -ESHUTDOWN. */
int at_acquire(struct at_pool *p) {
    pthread_mutex_lock(&p->mu);
    while (p->ntokens == 0 && !p->stopping) pthread_cond_wait(&p->tokens, &p->mu);
    int rc = -ESHUTDOWN;
    if (p->ntokens > 0) {
        p->ntokens--;
        if (++p->in_flight > p->peak) p->peak = p->in_flight;
        rc = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void at_release(struct at_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->ntokens++;
    p->in_flight--;
    pthread_cond_signal(&p->tokens);
    if (p->queued > 0) pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

/* counts: [0] in flight, [1] peak in flight, [2] queued */
void at_counts(struct at_pool *p, int32_t *out) {
    pthread_mutex_lock(&p->mu);
    out[0] = p->in_flight;
    out[1] = p->peak;
    out[2] = p->queued;
    pthread_mutex_unlock(&p->mu);
}

/* No new jobs; workers end once the queue is empty. Does not wait. */
void at_shutdown(struct at_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->tokens);
    pthread_mutex_unlock(&p->mu);
}

/* Stop, join the workers (they finish the queued jobs first), free everything. Blocks. */
void at_free(struct at_pool *p) {
    if (!p) return;
    at_shutdown(p);
    for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    if (p->efd >= 0) close(p->efd);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->tokens);
    pthread_mutex_destroy(&p->mu);
    free(p->ops);
    free(p->res);
    free(p->done);
    free(p->threads);
    free(p);
}
