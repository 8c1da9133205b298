/* The nvme tier's slab writes with no tier around them (bench_nvme_writes.py's "bare C"):
 * `depth` C threads take the next slot in turn and write it with one pwritev of a header
 * block and its chunk, O_DIRECT, at slot * (header + chunk) of a file preallocated before
 * the clock starts (as the tier's slab and fio's file are); chunk i comes from chunk
 * i % view of one primary buffer of `view` chunks, as the tier's do. Then one fdatasync.
 * No checksum, no journal, no index: what is left is the system calls and the buffer.
 * With `huge`, the buffer is on transparent huge pages (2 MiB-aligned, MADV_HUGEPAGE), as
 * asynctier.buffers.allocate_buffer makes it; else on 4 KiB pages (MADV_NOHUGEPAGE, as
 * allocate_buffer(huge_pages=False)).
 *
 *   bare_slab_c PATH CHUNK N DEPTH VIEW HEADER [huge]
 *
 * Prints the seconds from the first write to the end of the fdatasync; removes PATH. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long chunk, n, view, header;
static int fd;
static char *buf, *headers;
static long next_slot; /* taken with __atomic_fetch_add */
static int failed;

static void *writer(void *arg) {
    char *hb = headers + (long)(intptr_t)arg * header;
    for (;;) {
        long i = __atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED);
        if (i >= n) return NULL;
        memcpy(hb, &i, sizeof i); /* a header that differs per slot, as the tier's */
        struct iovec iov[2] = {{hb, (size_t)header}, {buf + (i % view) * chunk, (size_t)chunk}};
        off_t off = (off_t)i * (header + chunk);
        ssize_t want = header + chunk, done = 0;
        while (done < want) { /* (O_DIRECT writes of whole blocks: a short one is resumed) */
            ssize_t w = pwritev(fd, iov, 2, off + done);
            if (w <= 0) {
                if (w < 0 && errno == EINTR) continue;
                perror("pwritev");
                __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
                return NULL;
            }
            done += w;
            for (int k = 0; k < 2 && w > 0; k++) { /* advance the iovecs past what was written */
                size_t take = (size_t)w < iov[k].iov_len ? (size_t)w : iov[k].iov_len;
                iov[k].iov_base = (char *)iov[k].iov_base + take;
                iov[k].iov_len -= take;
                w -= (ssize_t)take;
            }
        }
    }
}

int main(int argc, char **argv) {
    int huge = argc == 8 && strcmp(argv[7], "huge") == 0;
    if (argc != 7 && !huge) {
        fprintf(stderr, "usage: %s PATH CHUNK N DEPTH VIEW HEADER [huge]\n", argv[0]);
        return 2;
    }
    chunk = atol(argv[2]);
    n = atol(argv[3]);
    long depth = atol(argv[4]);
    view = atol(argv[5]);
    header = atol(argv[6]);
    if (chunk <= 0 || n <= 0 || depth <= 0 || view <= 0 || header <= 0 || chunk % 4096 || header % 4096) {
        fprintf(stderr, "bare_slab_c: CHUNK and HEADER must be positive multiples of 4096, N, DEPTH, VIEW positive\n");
        return 2;
    }
    fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) { perror(argv[1]); return 1; }
    int rc = posix_fallocate(fd, 0, (off_t)n * (header + chunk));
    if (rc) { fprintf(stderr, "posix_fallocate: %s\n", strerror(rc)); return 1; }
    const size_t HUGE = 2u << 20;
    if (huge) { /* room to start on a 2 MiB boundary; the advice is a hint, as the library's */
        char *m = mmap(NULL, (size_t)(view * chunk) + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        buf = m == MAP_FAILED ? NULL : (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
        if (buf) madvise(buf, (size_t)(view * chunk), MADV_HUGEPAGE);
    }
    if ((huge ? buf == NULL : posix_memalign((void **)&buf, 4096, (size_t)(view * chunk)) != 0) ||
        posix_memalign((void **)&headers, 4096, (size_t)(depth * header))) {
        fprintf(stderr, "bare_slab_c: out of memory\n");
        return 1;
    }
    if (!huge) madvise(buf, (size_t)(view * chunk), MADV_NOHUGEPAGE); /* 4 KiB pages even where THP is "always" */
    for (long i = 0; i < view * chunk; i++) buf[i] = (char)(i * 2654435761u >> 13); /* not all equal */
    memset(headers, 0, (size_t)(depth * header));
    pthread_t *threads = calloc((size_t)depth, sizeof *threads);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long t = 0; t < depth; t++) pthread_create(&threads[t], NULL, writer, (void *)(intptr_t)t);
    for (long t = 0; t < depth; t++) pthread_join(threads[t], NULL);
    if (fdatasync(fd)) { perror("fdatasync"); failed = 1; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    unlink(argv[1]);
    if (failed) return 1;
    printf("%.6f\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
