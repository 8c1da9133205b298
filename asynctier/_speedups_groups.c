/* asynctier._speedups, a group job's side: the fs tier plans a group of loads or stores (up to
 * GROUP_CHUNKS files, tiers/fs/fast.py) in one call here instead of one descriptor per chunk,
 * and checks its outcomes in one call. Each function has its Python twin, the reference and
 * the fallback, in asynctier/tiers/fs/bulk.py (tests/test_c_twins.py compares them):
 *
 * pack_reads: each chunk's READ descriptor (its file named as name_of names it), written into
 * the pool's table of the group's jobs; reads_failed: the reads that did not bring their whole
 * file with the header expected (the payload's checksum the workers computed).
 * pack_writes and pack_recycles: each store's header into its header block and its WRITE (a
 * new unnamed file) or RECYCLE (the victim's file) descriptor; jobs_failed: the jobs that did
 * not simply succeed. */
#include "_speedups.h"

/* Job j's values, as its checks read them: the write pass writes these, not the Python objects
 * read again (and no Python code runs in between: exact ints and bytes, no lookups). */
struct job_vals {
    int32_t dfd, dfd2, fd; /* its key's shard directory, its victim's, its file */
    uint64_t block, hb, buf; /* its header block, that block's address, its payload's */
    const char *temp; /* a recycle's temporary name */
};

/* What the packers share: the caller's table of descriptors, with room for m at offset, and
 * their sequences (PySequence_Fast): m items each but the last, dfds, the N_SHARDS shard
 * directories (those used are checked by check_shard); each job's values (vals, m of them). */
struct packing {
    Py_buffer table;
    int have_table, nseq;
    PyObject *seq[6];
    Py_ssize_t m;
    struct at_job *jobs;
    struct job_vals *vals;
};

static void packing_close(struct packing *pk) {
    if (pk->have_table) PyBuffer_Release(&pk->table);
    for (int i = 0; i < pk->nseq; i++) Py_XDECREF(pk->seq[i]);
    PyMem_Free(pk->vals);
}

/* Open pk over args[0] (the table), args[1] (the offset) and the nseq sequences from args[first];
 * -1 with an error (then packing_close it all the same). */
static int packing_open(struct packing *pk, PyObject *const *args, int first, int nseq, const char *const *what,
                        const char *fn) {
    memset(pk, 0, sizeof *pk);
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) return -1;
    for (; pk->nseq < nseq; pk->nseq++) {
        PyObject *q = PySequence_Fast(args[first + pk->nseq], "a sequence is wanted");
        if (q == NULL) {
            PyErr_Format(PyExc_TypeError, "%s(): %s is a sequence", fn, what[pk->nseq]);
            return -1;
        }
        pk->seq[pk->nseq] = q;
    }
    pk->m = PySequence_Fast_GET_SIZE(pk->seq[0]);
    for (int i = 1; i < nseq; i++) {
        Py_ssize_t want = i == nseq - 1 ? N_SHARDS : pk->m, got = PySequence_Fast_GET_SIZE(pk->seq[i]);
        if (got != want) {
            PyErr_Format(PyExc_ValueError, "%s(): %zd %s, not %zd (one per key; %d dfds)", fn, got, what[i], want,
                         N_SHARDS);
            return -1;
        }
    }
    if (PyObject_GetBuffer(args[0], &pk->table, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    pk->have_table = 1;
    if (offset < 0 || offset > pk->table.len || pk->m > (pk->table.len - offset) / (Py_ssize_t)sizeof(struct at_job)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd descriptors at offset %zd of a %zd-byte table", fn, pk->m, offset,
                     pk->table.len);
        return -1;
    }
    pk->jobs = (struct at_job *)((char *)pk->table.buf + offset);
    if ((pk->vals = PyMem_Calloc((size_t)pk->m + 1, sizeof *pk->vals)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* A named key (exact bytes: check_key, then check_named_key) and its shard's directory, an
 * int32, in *dfd (only the shards used are looked at: a group uses a few of the N_SHARDS); -1
 * with an error. */
static int check_shard(const struct packing *pk, PyObject *key, int32_t *dfd, const char *fn) {
    if (check_key(key, fn) < 0 || check_named_key(key, fn) < 0) return -1;
    PyObject **ds = PySequence_Fast_ITEMS(pk->seq[pk->nseq - 1]);
    return get_i32(ds[xxh3(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)) & (N_SHARDS - 1)], dfd, fn, "a dfd");
}

/* A job's block and cid (exact ints) into v, with its header's and payload's addresses, hb_addr +
 * block * hb_len and view_addr + cid * n; -1 with an error (OverflowError past 2**64 - 1, where
 * the reference's 64-bit field refuses it with struct.error). */
static int check_addrs(struct job_vals *v, PyObject *cid, PyObject *block, uint64_t hb_addr, uint64_t hb_len,
                       uint64_t view_addr, uint64_t n, const char *fn) {
    uint64_t c;
    if (get_u64(cid, &c) < 0 || get_u64(block, &v->block) < 0) return -1;
    return addr_at(hb_addr, v->block, hb_len, &v->hb, fn) < 0 || addr_at(view_addr, c, n, &v->buf, fn) < 0 ? -1 : 0;
}

/* Job j of pk: its common fields (the rest zero), its file named after key as name_of names it. */
static struct at_job *put_job(const struct packing *pk, Py_ssize_t j, int32_t kind, int32_t prio, PyObject *key,
                              int32_t flags, int32_t fd, uint64_t hb_len, uint64_t n) {
    const struct job_vals *v = &pk->vals[j];
    struct at_job *job = &pk->jobs[j];
    memset(job, 0, sizeof *job);
    job->group = -1;
    job->kind = kind;
    job->prio = prio;
    job->dfd = v->dfd;
    job->flags = flags;
    job->fd = fd;
    job->dfd2 = -1;
    job->hb = (void *)(uintptr_t)v->hb;
    job->hb_len = (size_t)hb_len;
    job->buf = (void *)(uintptr_t)v->buf;
    job->len = (size_t)n;
    b32_into((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), job->name);
    return job;
}

/* pack_reads(table, offset, prio, keys, cids, blocks, dfds, flags, hashed, hb_addr, hb_len,
 * view_addr, n) -> None: for each j, the READ descriptor (struct at_job, group -1) of keys[j]'s
 * file, named as name_of names it in the directory dfds[shard], written at table[offset + j *
 * 856:]: header block blocks[j] of hb_len bytes from hb_addr, payload of n bytes into chunk
 * cids[j] of the view at view_addr. Everything is checked before a byte is written. */
PyObject *pack_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_reads";
    static const char *what[] = {"keys", "cids", "blocks", "dfds"};
    if (check_nargs(fn, nargs, 13) < 0) return NULL;
    int32_t prio, flags, hashed;
    uint64_t hb_addr, hb_len, view_addr, n;
    if (get_i32(args[2], &prio, fn, "prio") < 0 || get_i32(args[7], &flags, fn, "flags") < 0 ||
        get_i32(args[8], &hashed, fn, "hashed") < 0 || get_u64(args[9], &hb_addr) < 0 ||
        get_u64(args[10], &hb_len) < 0 || get_u64(args[11], &view_addr) < 0 || get_u64(args[12], &n) < 0 ||
        need_xxh3(fn) < 0)
        return NULL;
    struct packing pk;
    PyObject *out = NULL;
    if (packing_open(&pk, args, 3, 4, what, fn) < 0) goto done;
    PyObject **ks = PySequence_Fast_ITEMS(pk.seq[0]), **cs = PySequence_Fast_ITEMS(pk.seq[1]);
    PyObject **bs = PySequence_Fast_ITEMS(pk.seq[2]);
    for (Py_ssize_t j = 0; j < pk.m; j++)
        if (check_shard(&pk, ks[j], &pk.vals[j].dfd, fn) < 0 ||
            check_addrs(&pk.vals[j], cs[j], bs[j], hb_addr, hb_len, view_addr, n, fn) < 0)
            goto done;
    for (Py_ssize_t j = 0; j < pk.m; j++) put_job(&pk, j, AT_READ, prio, ks[j], flags, -1, hb_len, n)->hashed = hashed;
    out = Py_None;
    Py_INCREF(out);
done:
    packing_close(&pk);
    return out;
}

/* reads_failed(res, offset, keys, blocks, hbs, hb_len, n, layout_digest) -> list[int]: the
 * j whose read (its outcome, struct at_res, at res[offset + j * 24:]) failed, did not bring
 * hb_len + n bytes, or left in header block blocks[j] of hbs a header other than
 * pack_header(keys[j], n, the payload's checksum it computed, layout_digest). */
PyObject *reads_failed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "reads_failed";
    if (check_nargs(fn, nargs, 8) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    uint64_t hb_len, n;
    if (get_u64(args[5], &hb_len) < 0 || get_u64(args[6], &n) < 0 || check_digest(args[7], fn) < 0 ||
        need_xxh3(fn) < 0)
        return NULL;
    PyObject *keys = NULL, *blocks = NULL, *out = NULL, *bad = NULL;
    Py_buffer res = {0}, hbs = {0};
    int have_res = 0, have_hbs = 0;
    if ((keys = PySequence_Fast(args[2], "reads_failed(): keys is a sequence")) == NULL ||
        (blocks = PySequence_Fast(args[3], "reads_failed(): blocks is a sequence")) == NULL)
        goto done;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(keys);
    if (PySequence_Fast_GET_SIZE(blocks) != m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys but %zd blocks", fn, m, PySequence_Fast_GET_SIZE(blocks));
        goto done;
    }
    if (PyObject_GetBuffer(args[0], &res, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_res = 1;
    if (PyObject_GetBuffer(args[4], &hbs, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_hbs = 1;
    if (offset < 0 || offset > res.len || m > (res.len - offset) / (Py_ssize_t)sizeof(struct at_res)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd outcomes at offset %zd of %zd bytes", fn, m, offset, res.len);
        goto done;
    }
    /* (allocated before the checks: a collection it may start runs finalizers, Python code) */
    if ((bad = PyList_New(0)) == NULL) goto done;
    PyObject **ks = PySequence_Fast_ITEMS(keys), **bs = PySequence_Fast_ITEMS(blocks);
    uint64_t block;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (check_key(ks[j], fn) < 0 || get_u64(bs[j], &block) < 0) goto done;
        Py_ssize_t size = FIXED_LEN + PyBytes_GET_SIZE(ks[j]) + 8;
        if (hb_len > (uint64_t)hbs.len || (uint64_t)size > hb_len || block >= (uint64_t)hbs.len / hb_len) {
            PyErr_Format(PyExc_ValueError, "%s(): header %zd (%zd bytes) does not fit block %llu of %llu bytes in %zd",
                         fn, j, size, (unsigned long long)block, (unsigned long long)hb_len, hbs.len);
            goto done;
        }
    }
    const char *digest = PyBytes_AS_STRING(args[7]);
    unsigned char want[FIXED_LEN + MAX_B32_KEY + 8], *big = NULL;
    for (Py_ssize_t j = 0; j < m; j++) {
        struct at_res r;
        memcpy(&r, (const char *)res.buf + offset + j * (Py_ssize_t)sizeof r, sizeof r);
        get_u64(bs[j], &block);
        Py_ssize_t klen = PyBytes_GET_SIZE(ks[j]), size = FIXED_LEN + klen + 8;
        int ok = r.stage == 0 && r.result >= 0 && (uint64_t)r.result == hb_len + n;
        if (ok) {
            unsigned char *w = want;
            if (size > (Py_ssize_t)sizeof want && (w = big = PyMem_Malloc((size_t)size)) == NULL) {
                PyErr_NoMemory();
                Py_CLEAR(bad);
                goto done;
            }
            put_header(w, PyBytes_AS_STRING(ks[j]), klen, n, r.csum, 0, digest);
            ok = memcmp((const char *)hbs.buf + block * hb_len, w, (size_t)size) == 0;
            PyMem_Free(big);
            big = NULL;
        }
        if (!ok) {
            PyObject *i = PyLong_FromSsize_t(j);
            if (i == NULL || PyList_Append(bad, i) < 0) {
                Py_XDECREF(i);
                Py_CLEAR(bad);
                goto done;
            }
            Py_DECREF(i);
        }
    }
    out = bad;
    bad = NULL;
done:
    if (have_res) PyBuffer_Release(&res);
    if (have_hbs) PyBuffer_Release(&hbs);
    Py_XDECREF(keys);
    Py_XDECREF(blocks);
    Py_XDECREF(bad);
    return out;
}

/* A temporary file name: ASCII str shorter than a descriptor's name field, else -1. */
static const char *get_temp(PyObject *v, const char *fn) {
    Py_ssize_t len;
    const char *p = PyUnicode_Check(v) && PyUnicode_IS_ASCII(v) ? PyUnicode_AsUTF8AndSize(v, &len) : NULL;
    if (p == NULL || len >= NAME_MAX_LEN) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s(): a temporary name is an ASCII str of under %d characters", fn,
                         NAME_MAX_LEN);
        return NULL;
    }
    return p;
}

/* A store's header, pack_header(key, n, 0, digest), at the start of its block of hb_len bytes,
 * the rest zeroed (the block is written to the file whole); its size. */
static Py_ssize_t put_block_header(unsigned char *hb, uint64_t hb_len, PyObject *key, uint64_t n, const char *digest) {
    Py_ssize_t size = put_header(hb, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n, 0, 0, digest);
    memset(hb + size, 0, (size_t)(hb_len - (uint64_t)size));
    return size;
}

/* Whether key's header fits block `block` of hb_len bytes in hbs (else -1 with ValueError). */
static int check_block(const Py_buffer *hbs, uint64_t hb_len, uint64_t block, PyObject *key, Py_ssize_t j,
                       const char *fn) {
    Py_ssize_t size = FIXED_LEN + PyBytes_GET_SIZE(key) + 8;
    if (hb_len > (uint64_t)hbs->len || (uint64_t)size > hb_len || block >= (uint64_t)hbs->len / hb_len) {
        PyErr_Format(PyExc_ValueError, "%s(): header %zd (%zd bytes) does not fit block %llu of %llu bytes in %zd", fn,
                     j, size, (unsigned long long)block, (unsigned long long)hb_len, hbs->len);
        return -1;
    }
    return 0;
}

/* pack_writes(table, offset, prio, keys, cids, blocks, fds, dfds, flags, sync, mode, hbs,
 * hb_addr, hb_len, view_addr, n, layout_digest) -> None: for each j, the store of chunk cids[j]
 * under keys[j] into a new unnamed file (one AT_WRITE job: fds[j], a file made ahead, or -1 for
 * the worker to make one; published by linking it at the key's name): its header, with a zero
 * checksum, written into header block blocks[j] of hbs (the rest zeroed) and the descriptor at
 * table[offset + j * 856:]. Everything is checked before a byte is written. */
PyObject *pack_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_writes";
    static const char *what[] = {"keys", "cids", "blocks", "fds", "dfds"};
    if (check_nargs(fn, nargs, 17) < 0) return NULL;
    int32_t prio, flags, sync, mode;
    uint64_t hb_addr, hb_len, view_addr, n;
    if (get_i32(args[2], &prio, fn, "prio") < 0 || get_i32(args[8], &flags, fn, "flags") < 0 ||
        get_i32(args[9], &sync, fn, "sync") < 0 || get_i32(args[10], &mode, fn, "mode") < 0 ||
        get_u64(args[12], &hb_addr) < 0 || get_u64(args[13], &hb_len) < 0 || get_u64(args[14], &view_addr) < 0 ||
        get_u64(args[15], &n) < 0 || check_digest(args[16], fn) < 0 || need_xxh3(fn) < 0)
        return NULL;
    struct packing pk;
    PyObject *out = NULL;
    Py_buffer hbs = {0};
    int have_hbs = 0;
    if (packing_open(&pk, args, 3, 5, what, fn) < 0) goto done;
    if (PyObject_GetBuffer(args[11], &hbs, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_hbs = 1;
    PyObject **ks = PySequence_Fast_ITEMS(pk.seq[0]), **cs = PySequence_Fast_ITEMS(pk.seq[1]);
    PyObject **bs = PySequence_Fast_ITEMS(pk.seq[2]), **fs = PySequence_Fast_ITEMS(pk.seq[3]);
    for (Py_ssize_t j = 0; j < pk.m; j++) {
        struct job_vals *v = &pk.vals[j];
        if (check_shard(&pk, ks[j], &v->dfd, fn) < 0 || get_i32(fs[j], &v->fd, fn, "a fd") < 0 ||
            check_addrs(v, cs[j], bs[j], hb_addr, hb_len, view_addr, n, fn) < 0 ||
            check_block(&hbs, hb_len, v->block, ks[j], j, fn) < 0)
            goto done;
    }
    const char *digest = PyBytes_AS_STRING(args[16]);
    for (Py_ssize_t j = 0; j < pk.m; j++) {
        const struct job_vals *v = &pk.vals[j];
        Py_ssize_t size = put_block_header((unsigned char *)hbs.buf + v->block * hb_len, hb_len, ks[j], n, digest);
        struct at_job *job = put_job(&pk, j, AT_WRITE, prio, ks[j], flags, v->fd, hb_len, n);
        job->sync = sync;
        job->body_len = (int32_t)(size - 8);
        job->mode = mode;
    }
    out = Py_None;
    Py_INCREF(out);
done:
    if (have_hbs) PyBuffer_Release(&hbs);
    packing_close(&pk);
    return out;
}

/* pack_recycles(table, offset, prio, keys, victims, temps, cids, blocks, dfds, flags, lock_fd,
 * sync, mode, hbs, hb_addr, hb_len, view_addr, n, layout_digest) -> None: for each j, the store
 * of chunk cids[j] under keys[j] into the file of victims[j] (one AT_RECYCLE job: renamed to
 * temps[j] while it is filled, its permission bits made `mode`): its header written as
 * pack_writes writes it and the descriptor at table[offset + j * 856:], the names as name_of
 * gives them. Everything is checked before a byte is written. */
PyObject *pack_recycles(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_recycles";
    static const char *what[] = {"keys", "victims", "temps", "cids", "blocks", "dfds"};
    if (check_nargs(fn, nargs, 19) < 0) return NULL;
    int32_t prio, flags, lock_fd, sync, mode;
    uint64_t hb_addr, hb_len, view_addr, n;
    if (get_i32(args[2], &prio, fn, "prio") < 0 || get_i32(args[9], &flags, fn, "flags") < 0 ||
        get_i32(args[10], &lock_fd, fn, "lock_fd") < 0 || get_i32(args[11], &sync, fn, "sync") < 0 ||
        get_i32(args[12], &mode, fn, "mode") < 0 || get_u64(args[14], &hb_addr) < 0 || get_u64(args[15], &hb_len) < 0 ||
        get_u64(args[16], &view_addr) < 0 || get_u64(args[17], &n) < 0 || check_digest(args[18], fn) < 0 ||
        need_xxh3(fn) < 0)
        return NULL;
    struct packing pk;
    PyObject *out = NULL;
    Py_buffer hbs = {0};
    int have_hbs = 0;
    if (packing_open(&pk, args, 3, 6, what, fn) < 0) goto done;
    if (PyObject_GetBuffer(args[13], &hbs, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_hbs = 1;
    PyObject **ks = PySequence_Fast_ITEMS(pk.seq[0]), **vs = PySequence_Fast_ITEMS(pk.seq[1]);
    PyObject **ts = PySequence_Fast_ITEMS(pk.seq[2]), **cs = PySequence_Fast_ITEMS(pk.seq[3]);
    PyObject **bs = PySequence_Fast_ITEMS(pk.seq[4]);
    for (Py_ssize_t j = 0; j < pk.m; j++) {
        struct job_vals *v = &pk.vals[j];
        if (check_shard(&pk, ks[j], &v->dfd, fn) < 0 || check_shard(&pk, vs[j], &v->dfd2, fn) < 0 ||
            (v->temp = get_temp(ts[j], fn)) == NULL ||
            check_addrs(v, cs[j], bs[j], hb_addr, hb_len, view_addr, n, fn) < 0 ||
            check_block(&hbs, hb_len, v->block, ks[j], j, fn) < 0)
            goto done;
    }
    const char *digest = PyBytes_AS_STRING(args[18]);
    for (Py_ssize_t j = 0; j < pk.m; j++) {
        const struct job_vals *v = &pk.vals[j];
        Py_ssize_t size = put_block_header((unsigned char *)hbs.buf + v->block * hb_len, hb_len, ks[j], n, digest);
        struct at_job *job = put_job(&pk, j, AT_RECYCLE, prio, ks[j], flags, lock_fd, hb_len, n);
        job->dfd2 = v->dfd2;
        job->sync = sync;
        job->body_len = (int32_t)(size - 8);
        job->mode = mode;
        b32_into((const unsigned char *)PyBytes_AS_STRING(vs[j]), PyBytes_GET_SIZE(vs[j]), job->name2);
        strcpy(job->name3, v->temp);
    }
    out = Py_None;
    Py_INCREF(out);
done:
    if (have_hbs) PyBuffer_Release(&hbs);
    packing_close(&pk);
    return out;
}

/* jobs_failed(res, offset, m) -> list[int]: the j whose outcome (struct at_res at res[offset +
 * j * 24:]) did not simply succeed: it names a failed step, or has info set (a write whose name
 * was taken by another writer). */
PyObject *jobs_failed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "jobs_failed";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]), m = PyLong_AsSsize_t(args[2]);
    if ((offset == -1 || m == -1) && PyErr_Occurred()) return NULL;
    Py_buffer res;
    if (PyObject_GetBuffer(args[0], &res, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *bad = NULL;
    if (offset < 0 || m < 0 || offset > res.len || m > (res.len - offset) / (Py_ssize_t)sizeof(struct at_res)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd outcomes at offset %zd of %zd bytes", fn, m, offset, res.len);
        goto done;
    }
    if ((bad = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t j = 0; j < m; j++) {
        struct at_res r;
        memcpy(&r, (const char *)res.buf + offset + j * (Py_ssize_t)sizeof r, sizeof r);
        if (r.stage == 0 && r.info == 0) continue;
        PyObject *i = PyLong_FromSsize_t(j);
        if (i == NULL || PyList_Append(bad, i) < 0) {
            Py_XDECREF(i);
            Py_CLEAR(bad);
            goto done;
        }
        Py_DECREF(i);
    }
done:
    PyBuffer_Release(&res);
    return bad;
}

/* split_plain(keys, cids, reserved, tmpfile, recycle) -> (rec, new, others, rkeys, rvictims,
 * rcids, nkeys, ncids): see asynctier.tiers.fs.bulk.split_plain, the reference. */
PyObject *split_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "split_plain";
    if (check_nargs(fn, nargs, 5) < 0) return NULL;
    int tmpfile = PyObject_IsTrue(args[3]), recycle = PyObject_IsTrue(args[4]);
    if (tmpfile < 0 || recycle < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[0], "split_plain(): keys is a sequence");
    PyObject *cids = keys ? PySequence_Fast(args[1], "split_plain(): cids is a sequence") : NULL;
    PyObject *res = cids ? PySequence_Fast(args[2], "split_plain(): reserved is a sequence") : NULL;
    PyObject *lists[8] = {NULL}, *out = NULL;
    if (res == NULL) goto done;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(res);
    if (PySequence_Fast_GET_SIZE(keys) != m || PySequence_Fast_GET_SIZE(cids) != m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys, %zd cids and %zd reservations (one each)", fn,
                     PySequence_Fast_GET_SIZE(keys), PySequence_Fast_GET_SIZE(cids), m);
        goto done;
    }
    for (int i = 0; i < 8; i++)
        if ((lists[i] = PyList_New(0)) == NULL) goto done;
    PyObject **ks = PySequence_Fast_ITEMS(keys), **cs = PySequence_Fast_ITEMS(cids), **rs = PySequence_Fast_ITEMS(res);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *r = rs[j], *pos = PyLong_FromSsize_t(j);
        if (pos == NULL) goto done;
        Py_ssize_t nv = PyList_CheckExact(r) ? PyList_GET_SIZE(r) : -1;
        int rc;
        if (nv == 1 && recycle)
            rc = PyList_Append(lists[0], pos) < 0 || PyList_Append(lists[3], ks[j]) < 0 ||
                 PyList_Append(lists[4], PyList_GET_ITEM(r, 0)) < 0 || PyList_Append(lists[5], cs[j]) < 0;
        else if (nv == 0 && tmpfile)
            rc = PyList_Append(lists[1], pos) < 0 || PyList_Append(lists[6], ks[j]) < 0 ||
                 PyList_Append(lists[7], cs[j]) < 0;
        else
            rc = PyList_Append(lists[2], pos) < 0;
        Py_DECREF(pos);
        if (rc) goto done;
    }
    out = PyTuple_New(8);
    if (out == NULL) goto done;
    for (int i = 0; i < 8; i++) {
        PyTuple_SET_ITEM(out, i, lists[i]);
        lists[i] = NULL;
    }
done:
    for (int i = 0; i < 8; i++) Py_XDECREF(lists[i]);
    Py_XDECREF(res);
    Py_XDECREF(cids);
    Py_XDECREF(keys);
    return out;
}
