/* The loop's side of the native pool never waits for the workers' lock (tests/test_native_handoff.py
 * builds and runs this). It includes the pool's private header to reach that lock, holds it as a
 * worker would, and checks from another thread, under a deadline, that submitting, reaping and
 * setting the low water mark still return, and that a slow path's token calls made holding the
 * GIL say -EAGAIN instead of waiting; then lets the workers go and reaps the job.
 * Exit status 0: passed; anything else (or being killed by the alarm): failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "_nativeio_pool.h"

/* the library's calls (no public header: Python reaches them through ctypes) */
struct at_pool *at_new(int nthreads, int ntokens, int nops, xxh3_fn xxh3, int nice);
void at_free(struct at_pool *p);
int at_eventfd(struct at_pool *p);
struct at_res *at_results(struct at_pool *p);
int at_submit_many(struct at_pool *p, int n, const int32_t *idx, const struct at_job *jobs);
int at_reap(struct at_pool *p, int32_t *out, int max);
void at_set_low_water(struct at_pool *p, int n);
int at_try_acquire(struct at_pool *p, int prio);
int at_try_release(struct at_pool *p);

static uint64_t no_hash(const void *buf, size_t len) {
    (void)buf;
    return len;
}

struct ctx {
    struct at_pool *p;
    int submitted, reaped, try_acquire, try_release;
    int32_t out[4];
};

static void *loop_side(void *arg) {
    struct ctx *c = arg;
    struct at_job j;
    memset(&j, 0, sizeof j);
    j.group = -1;
    j.kind = AT_UNLINK;
    j.dfd = AT_FDCWD;
    strcpy(j.name, "/nonexistent-asynctier-handoff-test/x");
    int32_t idx = 2;
    c->submitted = at_submit_many(c->p, 1, &idx, &j);
    at_set_low_water(c->p, 3);
    c->reaped = at_reap(c->p, c->out, 4);
    c->try_acquire = at_try_acquire(c->p, 0);
    c->try_release = at_try_release(c->p);
    return NULL;
}

int main(void) {
    alarm(20); /* the old pool's loop side blocked here for as long as the lock was held */
    struct at_pool *p = at_new(2, 1, 4, no_hash, 0);
    if (!p) return perror("at_new"), 2;
    struct ctx c = {p, 0, -1, 0, 0, {0}};
    pthread_mutex_lock(&p->mu); /* a worker holding the lock, descheduled for as long as it takes */
    pthread_t t;
    pthread_create(&t, NULL, loop_side, &c);
    pthread_join(t, NULL); /* returns only if the loop's side did not wait for the lock */
    if (c.submitted != 1 || c.reaped != 0) return fprintf(stderr, "submitted %d reaped %d\n", c.submitted, c.reaped), 3;
    if (c.try_acquire != -EAGAIN || c.try_release != -EAGAIN)
        return fprintf(stderr, "try_acquire %d try_release %d\n", c.try_acquire, c.try_release), 5;
    pthread_mutex_unlock(&p->mu);
    /* the workers now take the job from the ring, run it and report it */
    struct pollfd pfd = {at_eventfd(p), POLLIN, 0};
    int n = 0;
    for (int tries = 0; n == 0 && tries < 100; tries++) {
        poll(&pfd, 1, 100);
        n = at_reap(p, c.out, 4);
    }
    struct at_res *r = &at_results(p)[2];
    if (n != 1 || c.out[0] != 2 || r->stage != ST_UNLINK || r->result != -ENOENT)
        return fprintf(stderr, "reaped %d slot %d stage %d result %lld\n", n, c.out[0], r->stage, (long long)r->result), 4;
    /* the lock let go, the token is taken and given back without waiting. The worker that
     * ran the job may still hold the lock for a moment after its result shows (it gives back
     * its token and parks under it), so -EAGAIN is retried a while, not taken as a failure */
    int acq = -EAGAIN, rel = -EAGAIN;
    for (int tries = 0; acq == -EAGAIN && tries < 2000; tries++)
        if ((acq = at_try_acquire(p, 0)) == -EAGAIN) usleep(1000);
    for (int tries = 0; acq == 0 && rel == -EAGAIN && tries < 2000; tries++)
        if ((rel = at_try_release(p)) == -EAGAIN) usleep(1000);
    if (acq != 0 || rel != 0) return fprintf(stderr, "token calls failed: acquire %d release %d\n", acq, rel), 6;
    at_free(p);
    puts("ok");
    return 0;
}
