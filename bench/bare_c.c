/*
 * bare_c: the fs tier's system calls from C threads, for bench_fs.py's "bare C" column.
 *
 * The same calls as asynctier.benchkit.bare_file_per_chunk (the "bare" column, Python
 * threads), over the same layout, with no interpreter around them: what is left of the gap
 * between those threads and fio is the layout's, not Python's.
 *
 *   write: per chunk an unnamed file (O_TMPFILE, O_DIRECT when asked) in shard i % shards,
 *          one pwritev of a header block and the chunk, linkat under "bare-<i>", close;
 *          then syncfs (timed, as the tier is timed until its bytes are on the medium).
 *   read:  open "bare-<i>", one preadv into a header block and the chunk, close.
 *
 * Chunk i moves from or to its own slot of one buffer of N chunks, as the tier's chunks do
 * from the primary buffer (a reused buffer is faster to transfer here: the virtual disk's
 * host side copies from guest memory, and a buffer it has just copied is in its caches).
 * Each thread has its own header block. Prints the seconds the phase took. Usage:
 *
 *   bare_c DIR write|read CHUNK_BYTES N DEPTH SHARDS HEADER_BYTES DIRECT(0|1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *dir;
static int writing, direct_io;
static long chunk, n, shards, header;
static int *dfds;
static char *slots;
static atomic_long next_index;
static atomic_int failed;

static void fail(const char *what, long i) {
    fprintf(stderr, "bare_c: %s of chunk %ld: %s\n", what, i, strerror(errno));
    atomic_store(&failed, 1);
}

static void *worker(void *arg) {
    char *hb = arg;
    struct iovec iov[2] = {{hb, (size_t)header}, {NULL, (size_t)chunk}};
    char name[64], proc[64];
    for (;;) {
        long i = atomic_fetch_add(&next_index, 1);
        if (i >= n || atomic_load(&failed)) break;
        iov[1].iov_base = slots + i * chunk;
        int dfd = dfds[i % shards];
        snprintf(name, sizeof name, "bare-%ld", i);
        if (writing) {
            int fd = openat(dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC | direct_io, 0644);
            if (fd < 0) { fail("open", i); break; }
            if (pwritev(fd, iov, 2, 0) != header + chunk) { fail("pwritev", i); close(fd); break; }
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
            if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) != 0) { fail("linkat", i); close(fd); break; }
            close(fd);
        } else {
            int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | direct_io);
            if (fd < 0) { fail("open", i); break; }
            if (preadv(fd, iov, 2, 0) != header + chunk) { fail("preadv", i); close(fd); break; }
            close(fd);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s DIR write|read CHUNK_BYTES N DEPTH SHARDS HEADER_BYTES DIRECT(0|1)\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    writing = strcmp(argv[2], "write") == 0;
    if (!writing && strcmp(argv[2], "read") != 0) {
        fprintf(stderr, "bare_c: mode must be write or read, got %s\n", argv[2]);
        return 2;
    }
    chunk = atol(argv[3]);
    n = atol(argv[4]);
    long depth = atol(argv[5]);
    shards = atol(argv[6]);
    header = atol(argv[7]);
    direct_io = atoi(argv[8]) ? O_DIRECT : 0;
    if (chunk <= 0 || n <= 0 || depth <= 0 || shards <= 0 || header < 0) {
        fprintf(stderr, "bare_c: CHUNK_BYTES, N, DEPTH and SHARDS must be positive, HEADER_BYTES >= 0\n");
        return 2;
    }
    dfds = calloc((size_t)shards, sizeof *dfds);
    char path[4096];
    for (long s = 0; s < shards; s++) {
        snprintf(path, sizeof path, "%s/%03lx", dir, s);
        if (writing && mkdir(path, 0755) != 0 && errno != EEXIST) { perror(path); return 1; }
        dfds[s] = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfds[s] < 0) { perror(path); return 1; }
    }
    pthread_t *threads = calloc((size_t)depth, sizeof *threads);
    char **bufs = calloc((size_t)depth, sizeof *bufs);
    /* allocated and touched before the clock starts */
    if (posix_memalign((void **)&slots, 4096, (size_t)(n * chunk)) != 0) { perror("posix_memalign"); return 1; }
    for (long k = 0; k < n * chunk; k++) slots[k] = (char)((unsigned long)k * 2654435761u >> 13);
    for (long t = 0; t < depth; t++) {
        if (posix_memalign((void **)&bufs[t], 4096, (size_t)(header > 0 ? header : 4096)) != 0) { perror("posix_memalign"); return 1; }
        memset(bufs[t], 0, (size_t)(header > 0 ? header : 4096));
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long t = 0; t < depth; t++) pthread_create(&threads[t], NULL, worker, bufs[t]);
    for (long t = 0; t < depth; t++) pthread_join(threads[t], NULL);
    if (writing && syncfs(dfds[0]) != 0) fail("syncfs", -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (atomic_load(&failed)) return 1;
    printf("%.6f\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
