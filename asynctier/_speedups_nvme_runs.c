/* asynctier._speedups, an nvme job's runs of adjacent slots: cut from its slots (slot_runs);
 * a store's runs packed (pack_slot_writes: headers, iovecs, WRITEV descriptors) and their
 * outcomes read (runs_written); a load's runs packed (pack_slot_reads: iovecs, READV
 * descriptors) and each chunk they read checked (runs_loaded). One call for the whole job
 * instead of a few Python steps per chunk. Their Python twins, the references and the
 * fallbacks, are in asynctier/tiers/nvme/bulk.py and tiers/nvme/slab.slot_runs
 * (tests/test_c_twins_nvme.py compares them). Everything is checked before a byte is written. */
#include "_speedups.h"

/* How the functions here read their arguments: each sequence, and each run's list, copied into
 * a tuple of their own first (a dict lookup may run a stored key's __eq__, which may change the
 * caller's lists), then every int read once, by the exact-int helpers, into the C values below;
 * the write pass reads only those and the tuples, so it writes what was checked. */

/* A run's values, as checked: its stripe's fd, its offset, its length, and the addresses of its
 * first iovec and checksum. */
struct run_vals {
    int32_t fd;
    int64_t off;
    Py_ssize_t len;
    uint64_t iov, sums;
};

/* A chunk's values, as checked: its position, its header's sequence number and checksum, and
 * the addresses of its header block and payload. */
struct chunk_vals {
    Py_ssize_t pos;
    uint64_t seq, csum, hb, buf;
};

/* runs as a tuple of m tuples, each run's items, and how many items in all (*total); NULL with
 * an error. A run is a list (a non-empty one where nonempty). */
static PyObject *runs_tuple(PyObject *v, const char *msg, int nonempty, Py_ssize_t *total, const char *fn) {
    PyObject *runs = own_tuple(v, msg), *out = NULL;
    if (runs == NULL || (out = PyTuple_New(PyTuple_GET_SIZE(runs))) == NULL) goto done;
    *total = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(runs); j++) {
        PyObject *run = PyTuple_GET_ITEM(runs, j), *items;
        if (!PyList_Check(run) || (nonempty && PyList_GET_SIZE(run) == 0)) {
            PyErr_Format(PyExc_TypeError, "%s(): runs[%zd] is a %slist", fn, j, nonempty ? "non-empty " : "");
            Py_CLEAR(out);
            goto done;
        }
        if ((items = PyList_AsTuple(run)) == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(out, j, items);
        *total += PyTuple_GET_SIZE(items);
    }
done:
    Py_XDECREF(runs);
    return out;
}

/* A run's item, checked: a (position, slot, stripe, offset) tuple of exact ints; -1 with an error. */
static int run_item(PyObject *it, Py_ssize_t nk, Py_ssize_t nfd, Py_ssize_t *pos, int64_t *stripe, int64_t *off,
                    const char *fn) {
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 4) {
        PyErr_Format(PyExc_TypeError, "%s(): a run's items are (position, slot, stripe, offset) tuples", fn);
        return -1;
    }
    long long p, s, o;
    if (get_ll(PyTuple_GET_ITEM(it, 0), &p) < 0 || get_ll(PyTuple_GET_ITEM(it, 2), &s) < 0 ||
        get_ll(PyTuple_GET_ITEM(it, 3), &o) < 0)
        return -1;
    if (p < 0 || p >= nk || s < 0 || s >= nfd || o < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): position %lld of %zd keys, stripe %lld of %zd, offset %lld", fn, p, nk, s,
                     nfd, o);
        return -1;
    }
    *pos = (Py_ssize_t)p;
    *stripe = s;
    *off = o;
    return 0;
}

/* Run r's values from its head item's stripe and offset (fds[stripe] an int32) and from where
 * its chunks start (first); -1 with an error. */
static int run_head(struct run_vals *r, PyObject *fds, int64_t stripe, int64_t off, Py_ssize_t first, Py_ssize_t len,
                    uint64_t iov_addr, uint64_t sums_addr, const char *fn) {
    r->off = off;
    r->len = len;
    return get_i32(PyTuple_GET_ITEM(fds, stripe), &r->fd, fn, "fd") < 0 ||
                   addr_at(iov_addr, (uint64_t)first, 32, &r->iov, fn) < 0 ||
                   addr_at(sums_addr, (uint64_t)first, 8, &r->sums, fn) < 0
               ? -1
               : 0;
}

/* Chunk c's addresses: its payload's (from cids[pos], an exact int) and its header block's; -1
 * with an error. */
static int chunk_addrs(struct chunk_vals *ch, PyObject *cids, Py_ssize_t c, uint64_t hb_addr, uint64_t hb_len,
                       uint64_t view_addr, uint64_t n, const char *fn) {
    uint64_t cid;
    return get_u64(PyTuple_GET_ITEM(cids, ch->pos), &cid) < 0 || addr_at(view_addr, cid, n, &ch->buf, fn) < 0 ||
                   addr_at(hb_addr, (uint64_t)c, hb_len, &ch->hb, fn) < 0
               ? -1
               : 0;
}

/* Room for m runs' values and total chunks' (zeroed) in *rv and *cv (the caller frees both);
 * -1 with MemoryError. */
static int alloc_vals(struct run_vals **rv, Py_ssize_t m, struct chunk_vals **cv, Py_ssize_t total) {
    if ((*rv = PyMem_Calloc((size_t)m + 1, sizeof **rv)) != NULL &&
        (*cv = PyMem_Calloc((size_t)total + 1, sizeof **cv)) != NULL)
        return 0;
    PyErr_NoMemory();
    return -1;
}

/* Room for m descriptors at offset of table: where they go, or NULL with ValueError. */
static struct at_job *jobs_at(const Py_buffer *table, Py_ssize_t offset, Py_ssize_t m, const char *fn) {
    if (offset < 0 || offset > table->len || m > (table->len - offset) / (Py_ssize_t)sizeof(struct at_job)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd descriptors at offset %zd of a %zd-byte table", fn, m, offset,
                     table->len);
        return NULL;
    }
    return (struct at_job *)((char *)table->buf + offset);
}

/* m outcomes at offset of res: where they are, or NULL with ValueError. */
static const struct at_res *results_at(const Py_buffer *res, Py_ssize_t offset, Py_ssize_t m, const char *fn) {
    if (offset < 0 || offset > res->len || m > (res->len - offset) / (Py_ssize_t)sizeof(struct at_res)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd outcomes at offset %zd of %zd bytes", fn, m, offset, res->len);
        return NULL;
    }
    return (const struct at_res *)((const char *)res->buf + offset);
}

/* The caller's buffers a function reads or writes (up to three), taken in turn, released together. */
struct bufs {
    Py_buffer b[3];
    int n; /* how many were taken */
};

/* args[at[0]] .. args[at[k - 1]] into bs (k <= 3), each with flags; -1 with an error. Call
 * bufs_release either way. */
static int bufs_get(struct bufs *bs, PyObject *const *args, const int *at, int k, int flags) {
    for (bs->n = 0; bs->n < k; bs->n++)
        if (PyObject_GetBuffer(args[at[bs->n]], &bs->b[bs->n], flags) < 0) return -1;
    return 0;
}

static void bufs_release(struct bufs *bs) {
    while (bs->n > 0) PyBuffer_Release(&bs->b[--bs->n]);
}

/* Chunk c's two iovecs: its header block (hb_len bytes at hb), then its payload (n bytes at buf). */
static void put_iov(uint64_t *iov, Py_ssize_t c, uint64_t hb, uint64_t hb_len, uint64_t buf, uint64_t n) {
    iov[4 * c] = hb;
    iov[4 * c + 1] = hb_len;
    iov[4 * c + 2] = buf;
    iov[4 * c + 3] = n;
}

/* Run r's READV or WRITEV descriptor (group -1, the rest zero): its chunks' iovecs and
 * checksums, at its offset of its stripe's file. */
static struct at_job *put_run_job(struct at_job *job, int32_t kind, int32_t prio, const struct run_vals *r) {
    memset(job, 0, sizeof *job);
    job->group = -1;
    job->kind = kind;
    job->prio = prio;
    job->dfd = -1;
    job->fd = r->fd;
    job->dfd2 = -1;
    job->hb = (void *)(uintptr_t)r->iov;
    job->hb_len = (size_t)(2 * r->len);
    job->buf = (void *)(uintptr_t)r->sums;
    job->len = (size_t)r->len;
    job->off = r->off;
    return job;
}

/* pack_slot_writes(table, offset, prio, runs, keys, cids, slots, fds, hbs, hb_addr, hb_len, iovs,
 * iov_addr, sums_addr, view_addr, n, layout_digest) -> None: see bulk.pack_slot_writes.
 * Everything is checked before a byte is written. */
SP_HIDDEN PyObject *pack_slot_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_slot_writes";
    if (check_nargs(fn, nargs, 17) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    int32_t prio;
    uint64_t hb_addr, hb_len, iov_addr, sums_addr, view_addr, n;
    if ((offset == -1 && PyErr_Occurred()) || get_i32(args[2], &prio, fn, "prio") < 0 || get_u64(args[9], &hb_addr) < 0 ||
        get_u64(args[10], &hb_len) < 0 || get_u64(args[12], &iov_addr) < 0 || get_u64(args[13], &sums_addr) < 0 ||
        get_u64(args[14], &view_addr) < 0 || get_u64(args[15], &n) < 0 || check_digest(args[16], fn) < 0 ||
        need_xxh3(fn) < 0)
        return NULL;
    PyObject *slots = args[6];
    if (!PyDict_Check(slots)) {
        PyErr_Format(PyExc_TypeError, "%s(): slots is a dict by position", fn);
        return NULL;
    }
    PyObject *runs = NULL, *keys = NULL, *cids = NULL, *fds = NULL, *out = NULL;
    struct bufs bs = {0};
    Py_ssize_t total;
    struct run_vals *rv = NULL;
    struct chunk_vals *cv = NULL;
    if (!(runs = runs_tuple(args[3], "pack_slot_writes(): runs is a sequence", 1, &total, fn)) ||
        !(keys = own_tuple(args[4], "pack_slot_writes(): keys is a sequence")) ||
        !(cids = own_tuple(args[5], "pack_slot_writes(): cids is a sequence")) ||
        !(fds = own_tuple(args[7], "pack_slot_writes(): fds is a sequence")))
        goto done;
    if (bufs_get(&bs, args, (const int[]){0, 8, 11}, 3, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    const Py_buffer *table = &bs.b[0], *hbs = &bs.b[1], *iovs = &bs.b[2];
    Py_ssize_t m = PyTuple_GET_SIZE(runs), nk = PyTuple_GET_SIZE(keys), nfd = PyTuple_GET_SIZE(fds);
    if (PyTuple_GET_SIZE(cids) != nk) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys and %zd cids", fn, nk, PyTuple_GET_SIZE(cids));
        goto done;
    }
    struct at_job *jobs = jobs_at(table, offset, m, fn);
    if (jobs == NULL) goto done;
    if (alloc_vals(&rv, m, &cv, total) < 0) goto done;
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first, its values kept */
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        Py_ssize_t klen = -1, first = c;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(run); i++, c++) {
            PyObject *it = PyTuple_GET_ITEM(run, i);
            struct chunk_vals *ch = &cv[c];
            int64_t stripe, off;
            if (run_item(it, nk, nfd, &ch->pos, &stripe, &off, fn) < 0) goto done;
            PyObject *key = PyTuple_GET_ITEM(keys, ch->pos);
            if (check_key(key, fn) < 0) goto done;
            if (klen >= 0 && PyBytes_GET_SIZE(key) != klen) {
                PyErr_Format(PyExc_ValueError, "%s(): a run's keys are one length", fn);
                goto done;
            }
            klen = PyBytes_GET_SIZE(key);
            if ((uint64_t)(FIXED_LEN + klen + 8) > hb_len) {
                PyErr_Format(PyExc_ValueError, "%s(): a header of %zd bytes in a %llu-byte block", fn,
                             FIXED_LEN + klen + 8, (unsigned long long)hb_len);
                goto done;
            }
            /* (the lookup may run a stored key's __eq__: what it could change was copied) */
            PyObject *sl = PyDict_GetItemWithError(slots, PyTuple_GET_ITEM(it, 0));
            if (sl == NULL || !PyTuple_Check(sl) || PyTuple_GET_SIZE(sl) != 2 ||
                get_u64(PyTuple_GET_ITEM(sl, 1), &ch->seq) < 0) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_KeyError, "%s(): no (slot, seq) for position %zd", fn, ch->pos);
                goto done;
            }
            if (chunk_addrs(ch, cids, c, hb_addr, hb_len, view_addr, n, fn) < 0 ||
                (i == 0 &&
                 run_head(&rv[j], fds, stripe, off, first, PyTuple_GET_SIZE(run), iov_addr, sums_addr, fn) < 0))
                goto done;
        }
    }
    if (hb_len == 0 || (uint64_t)total > (uint64_t)hbs->len / hb_len || total > iovs->len / 32) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of header blocks and %zd of iovecs", fn, total,
                     hbs->len, iovs->len);
        goto done;
    }
    const char *digest = PyBytes_AS_STRING(args[16]);
    c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t size = 0;
        for (Py_ssize_t i = 0; i < rv[j].len; i++, c++) {
            PyObject *key = PyTuple_GET_ITEM(keys, cv[c].pos);
            size = put_header((unsigned char *)hbs->buf + c * hb_len, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n, 0,
                              cv[c].seq, digest);
            put_iov((uint64_t *)iovs->buf, c, cv[c].hb, hb_len, cv[c].buf, n);
        }
        put_run_job(&jobs[j], AT_WRITEV, prio, &rv[j])->body_len = (int32_t)(size - 8);
    }
    out = Py_None;
    Py_INCREF(out);
done:
    PyMem_Free(rv);
    PyMem_Free(cv);
    bufs_release(&bs);
    Py_XDECREF(runs);
    Py_XDECREF(keys);
    Py_XDECREF(cids);
    Py_XDECREF(fds);
    return out;
}

/* runs_written(res, offset, runs, sums, csums, written) -> list[int]: see bulk.runs_written. */
SP_HIDDEN PyObject *runs_written(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "runs_written";
    if (check_nargs(fn, nargs, 6) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    PyObject *csums = args[4], *written = args[5];
    if (!PyDict_Check(csums) || !PyList_Check(written)) {
        PyErr_Format(PyExc_TypeError, "%s(): csums is a dict and written a list", fn);
        return NULL;
    }
    /* (a tuple of our own: storing into csums may run a stored key's __eq__, which may change the lists) */
    Py_ssize_t total;
    PyObject *runs = runs_tuple(args[2], "runs_written(): runs is a sequence", 0, &total, fn), *bad = NULL;
    if (runs == NULL) return NULL;
    struct bufs bs = {0};
    if (bufs_get(&bs, args, (const int[]){0, 3}, 2, PyBUF_C_CONTIGUOUS) < 0) goto done;
    const Py_buffer *res = &bs.b[0], *sums = &bs.b[1];
    Py_ssize_t m = PyTuple_GET_SIZE(runs);
    const struct at_res *r = results_at(res, offset, m, fn);
    if (r == NULL) goto done;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(run); i++) {
            PyObject *it = PyTuple_GET_ITEM(run, i); /* (an exact int's hash runs no Python code) */
            if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 4 || !PyLong_CheckExact(PyTuple_GET_ITEM(it, 0))) {
                PyErr_Format(PyExc_TypeError, "%s(): a run's items are (position, slot, stripe, offset) tuples", fn);
                goto done;
            }
        }
    }
    if (total > sums->len / 8) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of checksums", fn, total, sums->len);
        goto done;
    }
    if ((bad = PyList_New(0)) == NULL) goto done;
    const uint64_t *sum = (const uint64_t *)sums->buf;
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        Py_ssize_t len = PyTuple_GET_SIZE(run);
        if (r[j].stage || r[j].info != 1) {
            PyObject *o = PyLong_FromSsize_t(j);
            int rc = o ? PyList_Append(bad, o) : -1;
            Py_XDECREF(o);
            if (rc < 0) goto fail;
        } else {
            for (Py_ssize_t i = 0; i < len; i++) {
                PyObject *pos = PyTuple_GET_ITEM(PyTuple_GET_ITEM(run, i), 0);
                PyObject *v = PyLong_FromUnsignedLongLong(sum[c + i]);
                int rc = v ? PyDict_SetItem(csums, pos, v) : -1;
                Py_XDECREF(v);
                if (rc < 0 || PyList_Append(written, pos) < 0) goto fail;
            }
        }
        c += len;
    }
    goto done;
fail:
    Py_CLEAR(bad);
done:
    bufs_release(&bs);
    Py_DECREF(runs);
    return bad;
}

struct placed {
    int64_t stripe, off;
    long long pos, slot;
};

static int cmp_placed(const void *a, const void *b) {
    const struct placed *x = a, *y = b;
    if (x->stripe != y->stripe) return x->stripe < y->stripe ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* slot_runs(slots, nstripes, data_off, slot_size, limit) -> list[list[(position, slot,
 * stripe, offset)]]: see tiers.nvme.slab.slot_runs (OverflowError for an offset past 2**63 - 1). */
SP_HIDDEN PyObject *slot_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "slot_runs";
    if (check_nargs(fn, nargs, 5) < 0) return NULL;
    PyObject *slots = args[0];
    if (!PyDict_Check(slots)) {
        PyErr_Format(PyExc_TypeError, "%s(): slots is a dict of position -> (slot, ...)", fn);
        return NULL;
    }
    long long nstripes, data_off, size, limit;
    if (get_ll(args[1], &nstripes) < 0 || get_ll(args[2], &data_off) < 0 || get_ll(args[3], &size) < 0 ||
        get_ll(args[4], &limit) < 0)
        return NULL;
    if (nstripes < 1 || data_off < 0 || size < 1 || limit < 1) {
        PyErr_Format(PyExc_ValueError, "%s(): nstripes, slot_size and limit >= 1, data_off >= 0", fn);
        return NULL;
    }
    /* (exact ints: no Python code runs in the walk, so slots keeps its m items) */
    Py_ssize_t m = PyDict_GET_SIZE(slots), i = 0, at = 0;
    struct placed *pl = PyMem_Calloc((size_t)m + 1, sizeof *pl);
    if (pl == NULL) return PyErr_NoMemory();
    PyObject *k, *v, *out = NULL, *run = NULL;
    while (PyDict_Next(slots, &at, &k, &v)) {
        if (i >= m) break; /* (it grew: refused below) */
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < 1) {
            PyErr_Format(PyExc_TypeError, "%s(): a value of slots is a tuple, its slot first", fn);
            goto done;
        }
        struct placed *p = &pl[i++];
        if (get_ll(k, &p->pos) < 0 || get_ll(PyTuple_GET_ITEM(v, 0), &p->slot) < 0) goto done;
        if (p->slot < 0 || p->pos < 0) {
            PyErr_Format(PyExc_ValueError, "%s(): position %lld, slot %lld", fn, p->pos, p->slot);
            goto done;
        }
        p->stripe = p->slot % nstripes;
        if (__builtin_mul_overflow(p->slot / nstripes, size, &p->off) ||
            __builtin_add_overflow(p->off, data_off, &p->off)) {
            PyErr_Format(PyExc_OverflowError, "%s(): slot %lld's offset is past 2**63 - 1", fn, p->slot);
            goto done;
        }
    }
    if (i != m || PyDict_GET_SIZE(slots) != m) {
        PyErr_Format(PyExc_RuntimeError, "%s(): slots changed size while read", fn);
        goto done;
    }
    qsort(pl, (size_t)m, sizeof *pl, cmp_placed);
    if ((out = PyList_New(0)) == NULL) goto done;
    for (i = 0; i < m; i++) {
        PyObject *item = tuple_of(4, (PyObject *[]){PyLong_FromLongLong(pl[i].pos), PyLong_FromLongLong(pl[i].slot),
                                                    PyLong_FromLongLong(pl[i].stripe), PyLong_FromLongLong(pl[i].off)});
        if (item == NULL) goto fail;
        /* (offsets are >= 0: the difference does not overflow where off + size could) */
        if (run == NULL || pl[i].stripe != pl[i - 1].stripe || pl[i].off - pl[i - 1].off != size ||
            PyList_GET_SIZE(run) >= limit) {
            run = PyList_New(0);
            if (run == NULL || PyList_Append(out, run) < 0) {
                Py_XDECREF(run);
                Py_DECREF(item);
                goto fail;
            }
            Py_DECREF(run); /* (out holds it) */
        }
        int rc = PyList_Append(run, item);
        Py_DECREF(item);
        if (rc < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(pl);
    return out;
}

/* pack_slot_reads(table, offset, prio, runs, cids, fds, hb_addr, hb_len, iovs, iov_addr,
 * sums_addr, view_addr, n, hashed) -> None: see bulk.pack_slot_reads. Everything is checked
 * before a byte is written. */
SP_HIDDEN PyObject *pack_slot_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_slot_reads";
    if (check_nargs(fn, nargs, 14) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    int32_t prio, hashed;
    uint64_t hb_addr, hb_len, iov_addr, sums_addr, view_addr, n;
    if ((offset == -1 && PyErr_Occurred()) || get_i32(args[2], &prio, fn, "prio") < 0 || get_u64(args[6], &hb_addr) < 0 ||
        get_u64(args[7], &hb_len) < 0 || get_u64(args[9], &iov_addr) < 0 || get_u64(args[10], &sums_addr) < 0 ||
        get_u64(args[11], &view_addr) < 0 || get_u64(args[12], &n) < 0 || get_i32(args[13], &hashed, fn, "hashed") < 0)
        return NULL;
    PyObject *runs = NULL, *cids = NULL, *fds = NULL, *out = NULL;
    struct bufs bs = {0};
    Py_ssize_t total;
    struct run_vals *rv = NULL;
    struct chunk_vals *cv = NULL;
    if (!(runs = runs_tuple(args[3], "pack_slot_reads(): runs is a sequence", 1, &total, fn)) ||
        !(cids = own_tuple(args[4], "pack_slot_reads(): cids is a sequence")) ||
        !(fds = own_tuple(args[5], "pack_slot_reads(): fds is a sequence")))
        goto done;
    if (bufs_get(&bs, args, (const int[]){0, 8}, 2, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    const Py_buffer *table = &bs.b[0], *iovs = &bs.b[1];
    Py_ssize_t m = PyTuple_GET_SIZE(runs), nk = PyTuple_GET_SIZE(cids), nfd = PyTuple_GET_SIZE(fds);
    struct at_job *jobs = jobs_at(table, offset, m, fn);
    if (jobs == NULL) goto done;
    if (alloc_vals(&rv, m, &cv, total) < 0) goto done;
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first, its values kept */
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        Py_ssize_t first = c;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(run); i++, c++) {
            int64_t stripe, off;
            if (run_item(PyTuple_GET_ITEM(run, i), nk, nfd, &cv[c].pos, &stripe, &off, fn) < 0 ||
                chunk_addrs(&cv[c], cids, c, hb_addr, hb_len, view_addr, n, fn) < 0 ||
                (i == 0 &&
                 run_head(&rv[j], fds, stripe, off, first, PyTuple_GET_SIZE(run), iov_addr, sums_addr, fn) < 0))
                goto done;
        }
    }
    if (total > iovs->len / 32) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of iovecs", fn, total, iovs->len);
        goto done;
    }
    for (c = 0; c < total; c++) put_iov((uint64_t *)iovs->buf, c, cv[c].hb, hb_len, cv[c].buf, n);
    for (Py_ssize_t j = 0; j < m; j++) put_run_job(&jobs[j], AT_READV, prio, &rv[j])->hashed = hashed;
    out = Py_None;
    Py_INCREF(out);
done:
    PyMem_Free(rv);
    PyMem_Free(cv);
    bufs_release(&bs);
    Py_XDECREF(runs);
    Py_XDECREF(cids);
    Py_XDECREF(fds);
    return out;
}

/* The (slot, seq, csum) of position pos in found, checked: seq and csum in ch; -1 with an error. */
static int found_at(PyObject *found, PyObject *pos, struct chunk_vals *ch, const char *fn) {
    PyObject *f = PyDict_GetItemWithError(found, pos);
    if (f == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s(): position %R was not pinned", fn, pos);
        return -1;
    }
    if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 3) {
        PyErr_Format(PyExc_TypeError, "%s(): found holds (slot, seq, csum) tuples", fn);
        return -1;
    }
    return get_u64(PyTuple_GET_ITEM(f, 1), &ch->seq) < 0 || get_u64(PyTuple_GET_ITEM(f, 2), &ch->csum) < 0 ? -1 : 0;
}

/* runs_loaded(res, offset, runs, keys, found, hbs, hb_len, sums, n, layout_digest, verify, bad,
 * unpins) -> int: see bulk.runs_loaded. Every argument is checked before bad and unpins grow. */
SP_HIDDEN PyObject *runs_loaded(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "runs_loaded";
    if (check_nargs(fn, nargs, 13) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    uint64_t hb_len, n;
    int verify = PyObject_IsTrue(args[10]);
    if ((offset == -1 && PyErr_Occurred()) || get_u64(args[6], &hb_len) < 0 || get_u64(args[8], &n) < 0 ||
        check_digest(args[9], fn) < 0 || verify < 0 || need_xxh3(fn) < 0)
        return NULL;
    PyObject *found = args[4], *bad = args[11], *unpins = args[12];
    if (!PyDict_Check(found) || !PyList_Check(bad) || !PyList_Check(unpins)) {
        PyErr_Format(PyExc_TypeError, "%s(): found is a dict, bad and unpins lists", fn);
        return NULL;
    }
    PyObject *runs = NULL, *keys = NULL, *out = NULL;
    struct bufs bs = {0};
    Py_ssize_t total;
    struct chunk_vals *cv = NULL;
    if (!(runs = runs_tuple(args[2], "runs_loaded(): runs is a sequence", 0, &total, fn)) ||
        !(keys = own_tuple(args[3], "runs_loaded(): keys is a sequence")))
        goto done;
    if (bufs_get(&bs, args, (const int[]){0, 5, 7}, 3, PyBUF_C_CONTIGUOUS) < 0) goto done;
    const Py_buffer *res = &bs.b[0], *hbs = &bs.b[1], *sums = &bs.b[2];
    Py_ssize_t m = PyTuple_GET_SIZE(runs), nk = PyTuple_GET_SIZE(keys);
    const struct at_res *r = results_at(res, offset, m, fn);
    if (r == NULL) goto done;
    if ((cv = PyMem_Calloc((size_t)total + 1, sizeof *cv)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first, its values kept */
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(run); i++, c++) {
            PyObject *it = PyTuple_GET_ITEM(run, i);
            int64_t stripe, off;
            /* (found_at's lookup may run a stored key's __eq__: what it could change was copied) */
            if (run_item(it, nk, PY_SSIZE_T_MAX, &cv[c].pos, &stripe, &off, fn) < 0 ||
                check_key(PyTuple_GET_ITEM(keys, cv[c].pos), fn) < 0 ||
                found_at(found, PyTuple_GET_ITEM(it, 0), &cv[c], fn) < 0)
                goto done;
        }
    }
    if (hb_len == 0 || (uint64_t)total > (uint64_t)hbs->len / hb_len || total > sums->len / 8) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of header blocks and %zd of checksums", fn,
                     total, hbs->len, sums->len);
        goto done;
    }
    const uint64_t *sum = (const uint64_t *)sums->buf;
    const char *digest = PyBytes_AS_STRING(args[9]);
    unsigned char stack[FIXED_LEN + 1024 + 8], *want = stack; /* a header; longer keys' on the heap */
    Py_ssize_t good = 0;
    c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PyTuple_GET_ITEM(runs, j);
        int whole = !r[j].stage && r[j].info == 1;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(run); i++, c++) {
            PyObject *it = PyTuple_GET_ITEM(run, i), *key = PyTuple_GET_ITEM(keys, cv[c].pos);
            int ok = whole && (!verify || sum[c] == cv[c].csum);
            if (ok) { /* as header_matches(hbs[c * hb_len:], ...) */
                Py_ssize_t size = FIXED_LEN + PyBytes_GET_SIZE(key) + 8;
                if (size > (Py_ssize_t)sizeof stack && (want = PyMem_Malloc((size_t)size)) == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                put_header(want, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n, cv[c].csum, cv[c].seq, digest);
                ok = size <= hbs->len - c * (Py_ssize_t)hb_len &&
                     memcmp((const char *)hbs->buf + c * hb_len, want, (size_t)size) == 0;
                if (want != stack) {
                    PyMem_Free(want);
                    want = stack;
                }
            }
            if (ok)
                good++;
            else if (PyList_Append(bad, PyTuple_GET_ITEM(it, 0)) < 0)
                goto done;
            if (PyList_Append(unpins, PyTuple_GET_ITEM(it, 1)) < 0) goto done;
        }
    }
    out = PyLong_FromSsize_t(good);
done:
    PyMem_Free(cv);
    bufs_release(&bs);
    Py_XDECREF(runs);
    Py_XDECREF(keys);
    return out;
}
