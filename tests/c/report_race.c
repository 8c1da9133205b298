/* A job's end is counted in its own group even when the loop reuses its slot at once
 * (tests/test_native_handoff.py builds and runs this, with AT_TEST_HOOKS).
 *
 * The loop reaps without the workers' lock, so it may take a slot back and submit the next
 * job into it while the worker that published the last end is still in report(). Here the
 * worker is held just after publishing job A (group 1) of slot 0, the loop reaps A and
 * submits B (group 2) into slot 0, then lets the worker go. Each group's last end must
 * wake the loop, and both groups' counts end at zero. A report that read the slot's group
 * after publishing counted B's group down for A: A's group stayed at 1, B's end woke no
 * one, and a call waiting for it hung.
 * Exit status 0: passed; anything else (or being killed by the alarm): failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>

#include "_nativeio_pool.h"

struct at_pool *at_new(int nthreads, int ntokens, int nops, xxh3_fn xxh3, int nice);
void at_free(struct at_pool *p);
int at_eventfd(struct at_pool *p);
int at_submit_many(struct at_pool *p, int n, const int32_t *idx, const struct at_job *jobs);
int at_reap(struct at_pool *p, int32_t *out, int max);

static sem_t published, go;
static int hold_next = 1; /* hold the worker at the first end it publishes only */

void at_test_published(struct at_pool *p, int idx) {
    (void)p;
    (void)idx;
    if (__atomic_exchange_n(&hold_next, 0, __ATOMIC_SEQ_CST)) {
        sem_post(&published);
        sem_wait(&go);
    }
}

static uint64_t no_hash(const void *buf, size_t len) {
    (void)buf;
    return len;
}

static int submit(struct at_pool *p, int32_t slot, int group) {
    struct at_job j;
    memset(&j, 0, sizeof j);
    j.group = group;
    j.kind = AT_UNLINK;
    j.dfd = AT_FDCWD;
    strcpy(j.name, "/nonexistent-asynctier-report-race/x");
    return at_submit_many(p, 1, &slot, &j);
}

/* Whether the eventfd is written within `ms`; it is read back (emptied) if so. */
static int woken(struct at_pool *p, int ms) {
    struct pollfd pfd = {at_eventfd(p), POLLIN, 0};
    if (poll(&pfd, 1, ms) != 1) return 0;
    uint64_t v;
    return read(pfd.fd, &v, sizeof v) == sizeof v;
}

int main(void) {
    alarm(20);
    sem_init(&published, 0, 0);
    sem_init(&go, 0, 0);
    struct at_pool *p = at_new(1, 1, 4, no_hash, 0);
    if (!p) return perror("at_new"), 2;
    int32_t out[4];
    if (submit(p, 0, 1) != 1) return fputs("submit A failed\n", stderr), 3;
    sem_wait(&published); /* A's end is in the ring; its worker is held in report() */
    if (at_reap(p, out, 4) != 1 || out[0] != 0) return fputs("A not reaped\n", stderr), 4;
    if (submit(p, 0, 2) != 1) return fputs("submit B into A's slot failed\n", stderr), 5;
    sem_post(&go);
    int n = 0;
    for (int tries = 0; n == 0 && tries < 100; tries++) {
        woken(p, 100);
        n = at_reap(p, out, 4);
    }
    if (n != 1 || out[0] != 0) return fprintf(stderr, "B not reaped (%d)\n", n), 6;
    pthread_mutex_lock(&p->mu);
    int g1 = p->gcount[1], g2 = p->gcount[2];
    pthread_mutex_unlock(&p->mu);
    if (g1 != 0 || g2 != 0) return fprintf(stderr, "group counts left: group 1 %d, group 2 %d\n", g1, g2), 7;
    /* the same from the loop's view: a job of group 2 alone wakes it when it ends. First the
     * worker parks (it wrote the eventfd for B's end, if at all, before), and what the ends
     * above wrote is read */
    while (__atomic_load_n(&p->work_waiters, __ATOMIC_SEQ_CST) == 0) usleep(1000);
    while (woken(p, 0)) {
    }
    if (submit(p, 1, 2) != 1) return fputs("submit C failed\n", stderr), 8;
    int ok = 0;
    for (int tries = 0; !ok && tries < 50; tries++) ok = woken(p, 100) && at_reap(p, out, 4) == 1;
    if (!ok) return fputs("the end of group 2's only job woke no one\n", stderr), 9;
    at_free(p);
    puts("ok");
    return 0;
}
