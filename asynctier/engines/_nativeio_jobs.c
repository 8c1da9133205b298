/* The native workers' job bodies: one function per kind of job, from its first system call
 * to its last (the pool in _nativeio.c decides when each runs). Each reports through its
 * `struct at_res`: bytes moved, or the step that failed with -errno; anything but the plain
 * case is left to the Python code, which owns error handling. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_nativeio.h"

static int64_t move_all(int fd, int write, struct iovec *iov, int cnt, size_t total, int64_t base) {
    /* one preadv/pwritev for the whole chunk, from `base` on; loops on short transfers (EOF ends a read) */
    size_t done = 0;
    while (done < total) {
        off_t at = (off_t)(base + (int64_t)done);
        ssize_t n = write ? pwritev(fd, iov, cnt, at) : preadv(fd, iov, cnt, at);
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

/* Open an existing chunk file (the caller's flags carry O_NOFOLLOW and O_NONBLOCK): a
 * regular file only. Anything else someone put at the name fails the job without reading
 * it: a directory as reading it would (EISDIR at the I/O step), a FIFO or a device at the
 * open step with ENXIO; the Python code says what it was. `perm` nonzero: a victim's file
 * taken over keeps its inode, so its permission bits are set to the tier's where they differ
 * (files made under another `file_mode`); one that refuses (another user's) is not taken. */
static int open_regular(int dfd, const char *name, int flags, mode_t perm, struct at_res *r) {
    int fd = openat(dfd, name, flags | O_CLOEXEC);
    if (fd < 0) {
        r->result = -errno;
        r->stage = ST_OPEN;
        return -1;
    }
    struct stat st;
    int64_t bad = 0;
    if (fstat(fd, &st) != 0)
        bad = -errno;
    else if (!S_ISREG(st.st_mode))
        bad = S_ISDIR(st.st_mode) ? -EISDIR : -ENXIO;
    else if (perm && (st.st_mode & 07777) != perm && fchmod(fd, perm) != 0)
        bad = -errno;
    if (bad) {
        r->result = bad;
        r->stage = bad == -EISDIR ? ST_IO : ST_OPEN;
        close(fd);
        return -1;
    }
    return fd;
}

/* A chunk file opened by name, read from its start; or, with fd >= 0, the caller's open file
 * (a slab: tiers/nvme) read at `off`, and left open. */
static void run_read(struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    int fd = j->fd >= 0 ? j->fd : open_regular(j->dfd, j->name, j->flags, 0, r);
    if (fd < 0) return;
    struct iovec iov[2] = {{j->hb, j->hb_len}, {j->buf, j->len}};
    int64_t got = move_all(fd, 0, iov, 2, j->hb_len + j->len, j->fd >= 0 ? j->off : 0);
    if (j->fd < 0) close(fd);
    r->result = got;
    if (got < 0) r->stage = ST_IO;
}

/* A write's work before its I/O, holding no token: the header's checksums (it was packed
 * with a zero checksum: the payload's goes in, then the header's own over its body, see
 * asynctier.integrity.pack_header), and its unnamed file (O_TMPFILE: an inode on the file
 * system's orphan list, no data yet), as the tier's pool of files made ahead would. */
void at_prepare_write(xxh3_fn xxh3, struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    if (j->kind == AT_WRITEV) {
        const struct iovec *v = j->hb;
        uint64_t *sums = j->buf;
        for (size_t i = 0; i < j->len; i++) {
            char *hb = v[2 * i].iov_base;
            sums[i] = xxh3(v[2 * i + 1].iov_base, v[2 * i + 1].iov_len);
            put_u64le(hb + CSUM_OFFSET, sums[i]);
            put_u64le(hb + j->body_len, xxh3(hb, (size_t)j->body_len));
        }
        return;
    }
    if (j->body_len > 0) {
        char *hb = j->hb;
        uint64_t c = xxh3(j->buf, j->len);
        put_u64le(hb + CSUM_OFFSET, c);
        put_u64le(hb + j->body_len, xxh3(hb, (size_t)j->body_len));
        r->csum = c;
    }
    if (j->kind == AT_WRITE && j->fd < 0) { /* a new file (else the caller's: made ahead, or a spare) */
        mode_t mode = j->mode ? (mode_t)(j->mode & 07777) : 0644;
        if (j->name2[0]) /* named: where unnamed files cannot be made, or are not wanted */
            op->fd = openat(j->dfd2, j->name2, O_CREAT | O_EXCL | j->flags | O_CLOEXEC, mode);
        else
            op->fd = openat(j->dfd, ".", O_TMPFILE | j->flags | O_CLOEXEC, mode);
        if (op->fd >= 0 && (j->mode & AT_MODE_FIX) && fchmod(op->fd, mode) != 0) {
            int e = errno;
            close(op->fd);
            op->fd = -1;
            errno = e;
        }
        if (op->fd < 0) {
            r->result = -errno;
            r->stage = ST_OPEN;
        }
    }
}

/* AT_READV: info = 1 when every byte came (its payloads are then hashed, if asked).
 * AT_WRITEV: info = 1 when every byte went. */
static void run_vec(struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    int cnt = (int)j->hb_len;
    /* a copy: move_all advances it on a short transfer, and the hashing reads the caller's */
    struct iovec *iov = malloc((size_t)cnt * sizeof *iov);
    if (!iov) {
        r->result = -ENOMEM;
        r->stage = ST_IO;
        return;
    }
    memcpy(iov, j->hb, (size_t)cnt * sizeof *iov);
    size_t total = 0;
    for (int i = 0; i < cnt; i++) total += iov[i].iov_len;
    int64_t got = move_all(j->fd, j->kind == AT_WRITEV, iov, cnt, total, j->off);
    free(iov);
    r->result = got;
    if (got < 0)
        r->stage = ST_IO;
    else
        r->info = (size_t)got == total;
}

/* AT_COMMIT: the data first (durable), then the records, then the records synced (durable). */
static void run_commit(struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    const int32_t *fds = j->hb;
    for (size_t i = 0; i < j->hb_len; i++) {
        if (fdatasync(fds[i]) != 0) {
            r->result = -errno;
            r->stage = ST_DATASYNC;
            return;
        }
    }
    struct iovec iov = {j->buf, j->len};
    int64_t n = j->len ? move_all(j->fd, 1, &iov, 1, j->len, j->off) : 0;
    if (n < 0) {
        r->result = n;
        r->stage = ST_IO;
        return;
    }
    if (j->sync && fdatasync(j->fd) != 0) {
        r->result = -errno;
        r->stage = ST_DATASYNC;
        return;
    }
    r->result = n;
}

static void run_spare(struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    int fd = open_regular(j->dfd, j->name, j->flags, (mode_t)(j->mode & 07777), r);
    if (fd < 0) return;
    if (renameat(j->dfd, j->name, j->dfd2, j->name2) != 0) {
        r->result = -errno;
        r->stage = ST_RENAME;
        close(fd);
        return;
    }
    r->result = fd;
}

void at_withdraw_job(struct at_op *op, struct at_res *r, int handed) {
    struct at_job *j = &op->job;
    if (op->fd >= 0) { /* a new file prepare_write made: unnamed, it goes with its descriptor */
        close(op->fd);
        op->fd = -1;
        if (j->fd < 0 && j->name2[0]) (void)unlinkat(j->dfd2, j->name2, 0);
    }
    if (handed && j->kind == AT_WRITE && j->fd >= 0 && (j->mode & AT_MODE_CLOSE)) close(j->fd); /* as run_write would */
    memset(r, 0, sizeof *r);
    r->result = -ECANCELED;
    r->stage = ST_WITHDRAWN;
}

static void run_unlink(struct at_op *op, struct at_res *r) {
    if (unlinkat(op->job.dfd, op->job.name, 0) != 0) {
        r->result = -errno;
        r->stage = ST_UNLINK;
    }
}

static void run_write(struct at_op *op, struct at_res *r) {
    struct at_job *j = &op->job;
    if (r->stage) { /* failed in prepare_write: a file handed over is closed all the same */
        if (j->fd >= 0 && (j->mode & AT_MODE_CLOSE)) close(j->fd);
        return;
    }
    int fd = j->fd >= 0 ? j->fd : op->fd;
    struct iovec iov[2] = {{j->hb, j->hb_len}, {j->buf, j->len}};
    int64_t n = move_all(fd, 1, iov, 2, j->hb_len + j->len, 0);
    int stage = 0;
    int64_t err = 0;
    if (n < 0) {
        stage = ST_IO;
        err = n;
    } else if (j->sync && fdatasync(fd) != 0) {
        stage = ST_DATASYNC;
        err = -errno;
    } else if (j->name2[0]) { /* a named file (new, or taken over): renamed into place */
        if (renameat(j->dfd2, j->name2, j->dfd, j->name) != 0) {
            stage = ST_RENAME;
            err = -errno;
        }
    } else {
        char path[48];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, path, j->dfd, j->name, AT_SYMLINK_FOLLOW) != 0) {
            if (errno == EEXIST)
                r->info = 1; /* another writer published this key first: its copy stays */
            else {
                stage = ST_LINK;
                err = -errno;
            }
        }
    }
    if (j->fd < 0 || (j->mode & AT_MODE_CLOSE)) { /* else a file made ahead or taken over is the caller's to close */
        close(fd);
        op->fd = -1;
    }
    if (!stage && j->sync && fsync(j->dfd) != 0) {
        stage = ST_DIRSYNC;
        err = -errno;
    }
    r->stage = stage;
    r->result = stage ? err : n;
}

/* Whether no open file description but `lock_fd`'s holds a lock on its file (tiers/fs/owners.py:
 * every open tier holds a shared lock there); 0 where that cannot be told (nothing is recycled). */
static int alone(int lock_fd) {
    if (lock_fd < 0) return 0;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(lock_fd, F_OFD_GETLK, &fl) != 0) return 0;
    return fl.l_type == F_UNLCK;
}

/* AT_RECYCLE: the victim's file (dfd2/name2, opened with flags) is renamed to name3 in dfd;
 * then, only while no other tier holds the namespace (fd: the lock's descriptor), filled
 * and renamed to name. info = 1 once the file has left the victim's name: a failure after
 * that leaves it at name3 (closed), for the Python code to remove. */
static void run_recycle(struct at_op *op, struct at_res *r) {
    if (r->stage) return; /* failed in prepare_write */
    struct at_job *j = &op->job;
    int fd = open_regular(j->dfd2, j->name2, j->flags, (mode_t)(j->mode & 07777), r);
    if (fd < 0) return;
    int stage = 0;
    int64_t err = 0, n = 0;
    if (renameat(j->dfd2, j->name2, j->dfd, j->name3) != 0) {
        stage = ST_RENAME;
        err = -errno;
    } else {
        r->info = 1;
        struct iovec iov[2] = {{j->hb, j->hb_len}, {j->buf, j->len}};
        if (!alone(j->fd)) {
            stage = ST_SHARED;
            err = -EBUSY;
        } else if ((n = move_all(fd, 1, iov, 2, j->hb_len + j->len, 0)) < 0) {
            stage = ST_IO;
            err = n;
        } else if (j->sync && fdatasync(fd) != 0) {
            stage = ST_DATASYNC;
            err = -errno;
        } else if (renameat(j->dfd, j->name3, j->dfd, j->name) != 0) {
            stage = ST_RENAME;
            err = -errno;
        } else {
            r->info = 0; /* published: nothing is left at name3 */
            if (j->sync && fsync(j->dfd) != 0) {
                stage = ST_DIRSYNC;
                err = -errno;
            }
        }
    }
    close(fd);
    r->stage = stage;
    r->result = stage ? err : n;
}

void at_run_job(struct at_op *op, struct at_res *r) {
    switch (op->job.kind) {
    case AT_READ: run_read(op, r); break;
    case AT_WRITE: run_write(op, r); break;
    case AT_SPARE: run_spare(op, r); break;
    case AT_RECYCLE: run_recycle(op, r); break;
    case AT_READV:
    case AT_WRITEV: run_vec(op, r); break;
    case AT_COMMIT: run_commit(op, r); break;
    default: run_unlink(op, r); break;
    }
}

int at_read_whole(const struct at_op *op, const struct at_res *r) {
    if (op->job.kind == AT_READ) return r->result == (int64_t)(op->job.hb_len + op->job.len);
    return op->job.kind == AT_READV && r->info == 1;
}

void at_hash_read(xxh3_fn xxh3, struct at_op *op, struct at_res *r) {
    if (op->job.kind == AT_READV) {
        const struct iovec *v = op->job.hb;
        uint64_t *sums = op->job.buf;
        for (size_t i = 0; i < op->job.len; i++) sums[i] = xxh3(v[2 * i + 1].iov_base, v[2 * i + 1].iov_len);
    } else {
        r->csum = xxh3(op->job.buf, op->job.len);
    }
}
