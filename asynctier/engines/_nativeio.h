/* The job descriptors shared by the native workers' pool (_nativeio.c) and the job bodies
 * (_nativeio_jobs.c): what one job is, what it reports, and the steps it can fail at. */
#ifndef ASYNCTIER_NATIVEIO_H
#define ASYNCTIER_NATIVEIO_H

#include <stddef.h>
#include <stdint.h>

#define AT_READ 1
#define AT_WRITE 2
#define AT_SPARE 3  /* open a file (to be overwritten) and rename it away: result is the fd */
#define AT_UNLINK 4 /* unlink a name */
/* a store into an evicted file: open the victim's file, rename it away, make sure no one
 * else holds the namespace (its lock), overwrite it, rename it into place (one job for what
 * would be a spare and a write, with no trip through the event loop between them) */
#define AT_RECYCLE 5
/* one run of adjacent slots of a file the caller holds open (fd, at off), one preadv: hb is
 * the caller's struct iovec[hb_len] (each slot's header block, then its payload), buf its
 * uint64_t[len] for the payloads' xxh3 (hashed), len the slots (tiers/nvme/fast.py) */
#define AT_READV 6
#define READV_MAX 512 /* slots of one AT_READV or AT_WRITEV: two iovecs each, within IOV_MAX (1024) */
/* one run of adjacent slots of a file the caller holds open (fd, at off), one pwritev: hb is
 * the caller's struct iovec[hb_len] (each slot's header block, then its payload), buf its
 * uint64_t[len] for the payloads' xxh3, len the slots. Before the I/O, each payload is hashed
 * and its header's checksums filled in (the header's own over its first body_len bytes) */
#define AT_WRITEV 7
/* a journal commit: fdatasync of each of the hb_len descriptors at hb (int32_t; the data the
 * records describe), one pwrite of buf[len] at off of fd, then, with sync, fdatasync of fd.
 * It holds no I/O token: slow paths holding tokens may be waiting for it (the journal) */
#define AT_COMMIT 8
#define COMMIT_FDS_MAX 64
/* several jobs, each as if alone, spread over the workers: each is prepared (a write's
 * checksums) and run by whichever worker is free, holding a token of its own, so a group
 * keeps as many I/Os in flight as there are tokens, and it is reported once, when its last
 * job ends. hb is the caller's struct at_job[len] (reads: AT_READ or AT_READV; or writes:
 * AT_WRITE, AT_RECYCLE or AT_WRITEV; their group and prio ignored), copied at submission;
 * their outcomes go to the pool's own struct at_res[GROUP_MAX] of the slot
 * (at_group_results). The group's own result is len. One job for many small files, or for
 * the runs of a slab store or load: the loop plans and books one job, not one per file or
 * run, and the device still sees one request per run (tiers/fs/fast.py, tiers/nvme/stores.py
 * and fast.py) */
#define AT_GROUP 9
#define GROUP_MAX 32

#define AT_MODE_FIX 0x10000 /* the umask would strip bits of the mode: set it after creation */
#define AT_MODE_CLOSE 0x20000 /* AT_WRITE of a file fd the caller hands over: closed once done, as a new file is */

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
#define ST_RENAME 6
#define ST_SHARED 8 /* recycling: another tier holds the namespace (its file stays at name3) */
#define ST_UNLINK 7
/* a job of a group whose call was cancelled before a worker began it (at_withdraw): it did no
 * I/O, and what preparing it made (a new file) is gone, a file handed over closed */
#define ST_WITHDRAWN 9

#define NPRIO 4
#define NAME_MAX_LEN 256
#define CSUM_OFFSET 20 /* of the payload checksum in a packed header (asynctier.integrity) */

typedef uint64_t (*xxh3_fn)(const void *, size_t);

/* One job, as the caller describes it (laid out as asynctier.engines.descriptors.Job). */
struct at_job {
    int32_t group; /* -1: wake the loop when it ends; else a group of jobs (0..nops-1): when its last ends */
    int32_t pad;
    int32_t kind, prio;
    int32_t dfd, flags;
    int32_t fd;   /* writes: the file to fill (made ahead, or taken over), left open; -1: make one */
    int32_t dfd2; /* the directory of name2 */
    int32_t sync, hashed;
    int32_t body_len;
    int32_t mode; /* writes: the mode of a file the job makes (0: 0644); AT_MODE_FIX: fchmod it too;
                     AT_MODE_CLOSE: close fd once done; spares and recycles: the permission bits
                     the taken file gets (0: left as they are) */
    void *hb;
    size_t hb_len;
    void *buf;
    size_t len;
    int64_t off; /* reads of a given file (fd >= 0): where the header block starts in it */
    char name[NAME_MAX_LEN];
    char name2[NAME_MAX_LEN]; /* writes: publish by renaming this (the file's name); spares: the new name */
    char name3[NAME_MAX_LEN]; /* recycling: the victim's file's name while it is overwritten (in dfd) */
};

/* What Python reads back; one per slot, laid out as asynctier.engines.descriptors.Result. */
struct at_res {
    int64_t result;  /* bytes moved, or -errno of the failed step */
    uint64_t csum;   /* xxh3-64 of the payload (reads that got it all; writes) */
    int32_t stage;   /* ST_* of the failure, 0 if none */
    int32_t info;    /* writes: 1 if the name was taken already (EEXIST on link) */
};

/* a write's checksums, filled in by a worker before its I/O */
#define PREP_NONE 0    /* nothing to do: ready for I/O */
#define PREP_WANTED 1  /* queued, to be hashed first */
#define PREP_RUNNING 2 /* being hashed */
#define PREP_WITHDRAW 3 /* being hashed, and withdrawn (at_withdraw): undone once hashed, never run */

struct at_op {
    struct at_job job;
    int32_t state, prep;
    int32_t fd;   /* the file opened by prepare_write, or -1 */
    int32_t next; /* queue link */
    struct at_op *subs;     /* AT_GROUP: the slot's GROUP_MAX sub-jobs (job.len of them used) */
    struct at_res *subres;  /* and their outcomes */
    /* AT_GROUP, under the pool's lock: the next sub-job to prepare (job.len: none left) and
     * to run (in order: each once prepared), and how many have not ended */
    int32_t sub_prep, sub_io, sub_left;
};

#define AT_HIDDEN __attribute__((visibility("hidden"))) /* not part of the library's ctypes API */

/* A write's work before its I/O (its header's checksums, its unnamed file), holding no
 * token; never an AT_GROUP (each of its jobs is prepared on its own). */
AT_HIDDEN void at_prepare_write(xxh3_fn xxh3, struct at_op *op, struct at_res *r);
/* A job's system calls (its kind's body), holding a token; never an AT_GROUP. */
AT_HIDDEN void at_run_job(struct at_op *op, struct at_res *r);
/* A job whose I/O no worker began, withdrawn (with the pool's lock held): what its
 * preparation made is undone, with `handed` a file handed over (AT_MODE_CLOSE) closed too (a
 * job then reported, as a failed write's is), its outcome ST_WITHDRAWN. */
AT_HIDDEN void at_withdraw_job(struct at_op *op, struct at_res *r, int handed);
/* Whether a read got every byte: its payloads are then hashed (at_hash_read), if asked. */
AT_HIDDEN int at_read_whole(const struct at_op *op, const struct at_res *r);
/* A read's payload checksums, after its I/O (no token). */
AT_HIDDEN void at_hash_read(xxh3_fn xxh3, struct at_op *op, struct at_res *r);

#endif
