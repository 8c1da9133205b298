/* asynctier._speedups, an nvme job's runs of adjacent slots: cut from its slots (slot_runs);
 * a store's runs packed (pack_slot_writes: headers, iovecs, WRITEV descriptors) and their
 * outcomes read (runs_written); a load's runs packed (pack_slot_reads: iovecs, READV
 * descriptors) and each chunk they read checked (runs_loaded). One call for the whole job
 * instead of a few Python steps per chunk. Their Python twins, the references and the
 * fallbacks, are in asynctier/tiers/nvme/bulk.py and tiers/nvme/slab.slot_runs
 * (tests/test_c_twins_nvme.py compares them). Everything is checked before a byte is written. */
#include "_speedups.h"

/* A run's items, checked: (position, slot, stripe, offset) tuples; -1 with an error. */
static int run_item(PyObject *it, Py_ssize_t nk, Py_ssize_t nfd, Py_ssize_t *pos, int64_t *stripe, int64_t *off,
                    const char *fn) {
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 4) {
        PyErr_Format(PyExc_TypeError, "%s(): a run's items are (position, slot, stripe, offset) tuples", fn);
        return -1;
    }
    *pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 0));
    *stripe = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 2));
    *off = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 3));
    if (PyErr_Occurred()) return -1;
    if (*pos < 0 || *pos >= nk || *stripe < 0 || *stripe >= nfd || *off < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): position %zd of %zd keys, stripe %lld of %zd, offset %lld", fn, *pos, nk,
                     (long long)*stripe, nfd, (long long)*off);
        return -1;
    }
    return 0;
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

/* 0 if runs[j], run, is a non-empty list, else -1 with TypeError. */
static int check_run(PyObject *run, Py_ssize_t j, const char *fn) {
    if (PyList_Check(run) && PyList_GET_SIZE(run) > 0) return 0;
    PyErr_Format(PyExc_TypeError, "%s(): runs[%zd] is a non-empty list", fn, j);
    return -1;
}

/* Chunk c's two iovecs: its header block (hb_len bytes from hb_addr, one a chunk), then its payload. */
static void put_iov(uint64_t *iov, Py_ssize_t c, uint64_t hb_addr, uint64_t hb_len, uint64_t payload, uint64_t n) {
    iov[4 * c] = hb_addr + (uint64_t)c * hb_len;
    iov[4 * c + 1] = hb_len;
    iov[4 * c + 2] = payload;
    iov[4 * c + 3] = n;
}

/* A run's READV or WRITEV descriptor (group -1, the rest zero): len chunks from chunk first of
 * the job's iovecs and checksums, at offset off of the file fd. */
static struct at_job *put_run_job(struct at_job *job, int32_t kind, int32_t prio, int32_t fd, uint64_t iov_addr,
                                  uint64_t sums_addr, Py_ssize_t first, Py_ssize_t len, int64_t off) {
    memset(job, 0, sizeof *job);
    job->group = -1;
    job->kind = kind;
    job->prio = prio;
    job->dfd = -1;
    job->fd = fd;
    job->dfd2 = -1;
    job->hb = (void *)(uintptr_t)(iov_addr + 32 * (uint64_t)first);
    job->hb_len = (size_t)(2 * len);
    job->buf = (void *)(uintptr_t)(sums_addr + 8 * (uint64_t)first);
    job->len = (size_t)len;
    job->off = off;
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
    Py_buffer table = {0}, hbs = {0}, iovs = {0};
    int nbuf = 0;
    if (!(runs = PySequence_Fast(args[3], "pack_slot_writes(): runs is a sequence")) ||
        !(keys = PySequence_Fast(args[4], "pack_slot_writes(): keys is a sequence")) ||
        !(cids = PySequence_Fast(args[5], "pack_slot_writes(): cids is a sequence")) ||
        !(fds = PySequence_Fast(args[7], "pack_slot_writes(): fds is a sequence")))
        goto done;
    if (PyObject_GetBuffer(args[0], &table, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 1;
    if (PyObject_GetBuffer(args[8], &hbs, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 2;
    if (PyObject_GetBuffer(args[11], &iovs, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 3;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(runs), nk = PySequence_Fast_GET_SIZE(keys), nfd = PySequence_Fast_GET_SIZE(fds);
    if (PySequence_Fast_GET_SIZE(cids) != nk) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys and %zd cids", fn, nk, PySequence_Fast_GET_SIZE(cids));
        goto done;
    }
    if (jobs_at(&table, offset, m, fn) == NULL) goto done;
    Py_ssize_t total = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first */
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        if (check_run(run, j, fn) < 0) goto done;
        Py_ssize_t klen = -1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++) {
            Py_ssize_t pos;
            int64_t stripe, off;
            uint64_t u;
            if (run_item(PyList_GET_ITEM(run, i), nk, nfd, &pos, &stripe, &off, fn) < 0) goto done;
            PyObject *key = PySequence_Fast_GET_ITEM(keys, pos), *sl = PyDict_GetItemWithError(slots, PyTuple_GET_ITEM(PyList_GET_ITEM(run, i), 0));
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
            if (sl == NULL || !PyTuple_Check(sl) || PyTuple_GET_SIZE(sl) != 2 || get_u64(PyTuple_GET_ITEM(sl, 1), &u) < 0 ||
                get_u64(PySequence_Fast_GET_ITEM(cids, pos), &u) < 0) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_KeyError, "%s(): no (slot, seq) for position %zd", fn, pos);
                goto done;
            }
            int32_t fd;
            if (i == 0 && get_i32(PySequence_Fast_GET_ITEM(fds, stripe), &fd, fn, "fd") < 0) goto done;
        }
        total += PyList_GET_SIZE(run);
    }
    if (hb_len == 0 || (uint64_t)total > (uint64_t)hbs.len / hb_len || total > iovs.len / 32) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of header blocks and %zd of iovecs", fn, total,
                     hbs.len, iovs.len);
        goto done;
    }
    const char *digest = PyBytes_AS_STRING(args[16]);
    uint64_t *iov = (uint64_t *)iovs.buf;
    struct at_job *jobs = jobs_at(&table, offset, m, fn);
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        Py_ssize_t len = PyList_GET_SIZE(run), first = c, size = 0;
        int64_t stripe = 0, off = 0;
        for (Py_ssize_t i = 0; i < len; i++, c++) {
            PyObject *it = PyList_GET_ITEM(run, i);
            Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 0));
            if (i == 0) {
                stripe = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 2));
                off = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 3));
            }
            PyObject *key = PySequence_Fast_GET_ITEM(keys, pos), *sl = PyDict_GetItem(slots, PyTuple_GET_ITEM(it, 0));
            uint64_t seq = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(sl, 1));
            uint64_t cid = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(cids, pos));
            size = put_header((unsigned char *)hbs.buf + c * hb_len, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n, 0,
                              seq, digest);
            put_iov(iov, c, hb_addr, hb_len, view_addr + cid * n, n);
        }
        put_run_job(&jobs[j], AT_WRITEV, prio, (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(fds, stripe)), iov_addr,
                    sums_addr, first, len, off)
            ->body_len = (int32_t)(size - 8);
    }
    out = Py_None;
    Py_INCREF(out);
done:
    if (nbuf > 2) PyBuffer_Release(&iovs);
    if (nbuf > 1) PyBuffer_Release(&hbs);
    if (nbuf > 0) PyBuffer_Release(&table);
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
    PyObject *runs = PySequence_Fast(args[2], "runs_written(): runs is a sequence"), *bad = NULL;
    if (runs == NULL) return NULL;
    Py_buffer res = {0}, sums = {0};
    int nbuf = 0;
    if (PyObject_GetBuffer(args[0], &res, PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 1;
    if (PyObject_GetBuffer(args[3], &sums, PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 2;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(runs), total = 0;
    if (offset < 0 || offset > res.len || m > (res.len - offset) / (Py_ssize_t)sizeof(struct at_res)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd outcomes at offset %zd of %zd bytes", fn, m, offset, res.len);
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        if (!PyList_Check(run)) {
            PyErr_Format(PyExc_TypeError, "%s(): runs[%zd] is a list", fn, j);
            goto done;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++) {
            PyObject *it = PyList_GET_ITEM(run, i);
            if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 4 || !PyLong_Check(PyTuple_GET_ITEM(it, 0))) {
                PyErr_Format(PyExc_TypeError, "%s(): a run's items are (position, slot, stripe, offset) tuples", fn);
                goto done;
            }
        }
        total += PyList_GET_SIZE(run);
    }
    if (total > sums.len / 8) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of checksums", fn, total, sums.len);
        goto done;
    }
    if ((bad = PyList_New(0)) == NULL) goto done;
    const struct at_res *r = (const struct at_res *)((const char *)res.buf + offset);
    const uint64_t *sum = (const uint64_t *)sums.buf;
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        Py_ssize_t len = PyList_GET_SIZE(run);
        if (r[j].stage || r[j].info != 1) {
            PyObject *o = PyLong_FromSsize_t(j);
            int rc = o ? PyList_Append(bad, o) : -1;
            Py_XDECREF(o);
            if (rc < 0) goto fail;
        } else {
            for (Py_ssize_t i = 0; i < len; i++) {
                PyObject *pos = PyTuple_GET_ITEM(PyList_GET_ITEM(run, i), 0), *v = PyLong_FromUnsignedLongLong(sum[c + i]);
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
    if (nbuf > 1) PyBuffer_Release(&sums);
    if (nbuf > 0) PyBuffer_Release(&res);
    Py_DECREF(runs);
    return bad;
}

struct placed {
    int64_t stripe, off;
    Py_ssize_t pos;
    long slot;
};

static int cmp_placed(const void *a, const void *b) {
    const struct placed *x = a, *y = b;
    if (x->stripe != y->stripe) return x->stripe < y->stripe ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* slot_runs(slots, nstripes, data_off, slot_size, limit) -> list[list[(position, slot,
 * stripe, offset)]]: see tiers.nvme.slab.slot_runs. */
SP_HIDDEN PyObject *slot_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "slot_runs";
    if (check_nargs(fn, nargs, 5) < 0) return NULL;
    PyObject *slots = args[0];
    if (!PyDict_Check(slots)) {
        PyErr_Format(PyExc_TypeError, "%s(): slots is a dict of position -> (slot, ...)", fn);
        return NULL;
    }
    long long nstripes = PyLong_AsLongLong(args[1]), data_off = PyLong_AsLongLong(args[2]),
              size = PyLong_AsLongLong(args[3]), limit = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (nstripes < 1 || data_off < 0 || size < 1 || limit < 1) {
        PyErr_Format(PyExc_ValueError, "%s(): nstripes, slot_size and limit >= 1, data_off >= 0", fn);
        return NULL;
    }
    Py_ssize_t m = PyDict_GET_SIZE(slots), i = 0, at = 0;
    struct placed *pl = PyMem_Malloc(sizeof *pl * (size_t)(m > 0 ? m : 1));
    if (pl == NULL) return PyErr_NoMemory();
    PyObject *k, *v, *out = NULL, *run = NULL;
    while (PyDict_Next(slots, &at, &k, &v)) {
        long s;
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < 1) {
            PyErr_Format(PyExc_TypeError, "%s(): a value of slots is a tuple, its slot first", fn);
            goto done;
        }
        pl[i].pos = PyLong_AsSsize_t(k);
        s = PyLong_AsLong(PyTuple_GET_ITEM(v, 0));
        if (PyErr_Occurred()) goto done;
        if (s < 0 || pl[i].pos < 0) {
            PyErr_Format(PyExc_ValueError, "%s(): position %zd, slot %ld", fn, pl[i].pos, s);
            goto done;
        }
        pl[i].slot = s;
        pl[i].stripe = s % nstripes;
        pl[i].off = data_off + s / nstripes * size;
        i++;
    }
    qsort(pl, (size_t)m, sizeof *pl, cmp_placed);
    if ((out = PyList_New(0)) == NULL) goto done;
    for (i = 0; i < m; i++) {
        PyObject *item = Py_BuildValue("(nlLL)", pl[i].pos, pl[i].slot, (long long)pl[i].stripe, (long long)pl[i].off);
        if (item == NULL) goto fail;
        if (run == NULL || pl[i].stripe != pl[i - 1].stripe || pl[i].off != pl[i - 1].off + size ||
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
    uint64_t hb_addr, hb_len, iov_addr, sums_addr, view_addr, n, u;
    if ((offset == -1 && PyErr_Occurred()) || get_i32(args[2], &prio, fn, "prio") < 0 || get_u64(args[6], &hb_addr) < 0 ||
        get_u64(args[7], &hb_len) < 0 || get_u64(args[9], &iov_addr) < 0 || get_u64(args[10], &sums_addr) < 0 ||
        get_u64(args[11], &view_addr) < 0 || get_u64(args[12], &n) < 0 || get_i32(args[13], &hashed, fn, "hashed") < 0)
        return NULL;
    PyObject *runs = NULL, *cids = NULL, *fds = NULL, *out = NULL;
    Py_buffer table = {0}, iovs = {0};
    int nbuf = 0;
    if (!(runs = PySequence_Fast(args[3], "pack_slot_reads(): runs is a sequence")) ||
        !(cids = PySequence_Fast(args[4], "pack_slot_reads(): cids is a sequence")) ||
        !(fds = PySequence_Fast(args[5], "pack_slot_reads(): fds is a sequence")))
        goto done;
    if (PyObject_GetBuffer(args[0], &table, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 1;
    if (PyObject_GetBuffer(args[8], &iovs, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 2;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(runs), nk = PySequence_Fast_GET_SIZE(cids), nfd = PySequence_Fast_GET_SIZE(fds);
    if (jobs_at(&table, offset, m, fn) == NULL) goto done;
    Py_ssize_t total = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first */
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        if (check_run(run, j, fn) < 0) goto done;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++) {
            Py_ssize_t pos;
            int64_t stripe, off;
            int32_t fd;
            if (run_item(PyList_GET_ITEM(run, i), nk, nfd, &pos, &stripe, &off, fn) < 0 ||
                get_u64(PySequence_Fast_GET_ITEM(cids, pos), &u) < 0 ||
                (i == 0 && get_i32(PySequence_Fast_GET_ITEM(fds, stripe), &fd, fn, "fd") < 0))
                goto done;
        }
        total += PyList_GET_SIZE(run);
    }
    if (total > iovs.len / 32) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of iovecs", fn, total, iovs.len);
        goto done;
    }
    uint64_t *iov = (uint64_t *)iovs.buf;
    struct at_job *jobs = jobs_at(&table, offset, m, fn);
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j), *head = PyList_GET_ITEM(run, 0);
        Py_ssize_t len = PyList_GET_SIZE(run), first = c;
        for (Py_ssize_t i = 0; i < len; i++, c++) {
            Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(run, i), 0));
            uint64_t cid = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(cids, pos));
            put_iov(iov, c, hb_addr, hb_len, view_addr + cid * n, n);
        }
        int32_t fd = (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(fds, PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 2))));
        put_run_job(&jobs[j], AT_READV, prio, fd, iov_addr, sums_addr, first, len,
                    PyLong_AsLongLong(PyTuple_GET_ITEM(head, 3)))
            ->hashed = hashed;
    }
    out = Py_None;
    Py_INCREF(out);
done:
    if (nbuf > 1) PyBuffer_Release(&iovs);
    if (nbuf > 0) PyBuffer_Release(&table);
    Py_XDECREF(runs);
    Py_XDECREF(cids);
    Py_XDECREF(fds);
    return out;
}

/* The (slot, seq, csum) of position pos in found, checked; -1 with an error. */
static int found_at(PyObject *found, PyObject *pos, uint64_t *seq, uint64_t *csum, const char *fn) {
    PyObject *f = PyDict_GetItemWithError(found, pos);
    if (f == NULL) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s(): position %R was not pinned", fn, pos);
        return -1;
    }
    if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 3) {
        PyErr_Format(PyExc_TypeError, "%s(): found holds (slot, seq, csum) tuples", fn);
        return -1;
    }
    return get_u64(PyTuple_GET_ITEM(f, 1), seq) < 0 || get_u64(PyTuple_GET_ITEM(f, 2), csum) < 0 ? -1 : 0;
}

/* runs_loaded(res, offset, runs, keys, found, hbs, hb_len, sums, n, layout_digest, verify, bad,
 * unpins) -> int: see bulk.runs_loaded. Every argument is checked before bad and unpins grow. */
SP_HIDDEN PyObject *runs_loaded(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "runs_loaded";
    if (check_nargs(fn, nargs, 13) < 0) return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    uint64_t hb_len, n, seq, csum;
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
    Py_buffer res = {0}, hbs = {0}, sums = {0};
    int nbuf = 0;
    if (!(runs = PySequence_Fast(args[2], "runs_loaded(): runs is a sequence")) ||
        !(keys = PySequence_Fast(args[3], "runs_loaded(): keys is a sequence")))
        goto done;
    if (PyObject_GetBuffer(args[0], &res, PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 1;
    if (PyObject_GetBuffer(args[5], &hbs, PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 2;
    if (PyObject_GetBuffer(args[7], &sums, PyBUF_C_CONTIGUOUS) < 0) goto done;
    nbuf = 3;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(runs), nk = PySequence_Fast_GET_SIZE(keys), total = 0;
    if (offset < 0 || offset > res.len || m > (res.len - offset) / (Py_ssize_t)sizeof(struct at_res)) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd outcomes at offset %zd of %zd bytes", fn, m, offset, res.len);
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) { /* every run checked first */
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        if (!PyList_Check(run)) {
            PyErr_Format(PyExc_TypeError, "%s(): runs[%zd] is a list", fn, j);
            goto done;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++) {
            PyObject *it = PyList_GET_ITEM(run, i);
            Py_ssize_t pos;
            int64_t stripe, off;
            if (run_item(it, nk, PY_SSIZE_T_MAX, &pos, &stripe, &off, fn) < 0 ||
                check_key(PySequence_Fast_GET_ITEM(keys, pos), fn) < 0 ||
                found_at(found, PyTuple_GET_ITEM(it, 0), &seq, &csum, fn) < 0)
                goto done;
        }
        total += PyList_GET_SIZE(run);
    }
    if (hb_len == 0 || (uint64_t)total > (uint64_t)hbs.len / hb_len || total > sums.len / 8) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd chunks for %zd bytes of header blocks and %zd of checksums", fn,
                     total, hbs.len, sums.len);
        goto done;
    }
    const struct at_res *r = (const struct at_res *)((const char *)res.buf + offset);
    const uint64_t *sum = (const uint64_t *)sums.buf;
    const char *digest = PyBytes_AS_STRING(args[9]);
    unsigned char stack[FIXED_LEN + 1024 + 8], *want = stack; /* a header; longer keys' on the heap */
    Py_ssize_t good = 0, c = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, j);
        int whole = !r[j].stage && r[j].info == 1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(run); i++, c++) {
            PyObject *it = PyList_GET_ITEM(run, i), *pos = PyTuple_GET_ITEM(it, 0);
            PyObject *key = PySequence_Fast_GET_ITEM(keys, PyLong_AsSsize_t(pos));
            found_at(found, pos, &seq, &csum, fn);
            int ok = whole && (!verify || sum[c] == csum);
            if (ok) { /* as header_matches(hbs[c * hb_len:], ...) */
                Py_ssize_t size = FIXED_LEN + PyBytes_GET_SIZE(key) + 8;
                if (size > (Py_ssize_t)sizeof stack && (want = PyMem_Malloc((size_t)size)) == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                put_header(want, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n, csum, seq, digest);
                ok = size <= hbs.len - c * (Py_ssize_t)hb_len &&
                     memcmp((const char *)hbs.buf + c * hb_len, want, (size_t)size) == 0;
                if (want != stack) {
                    PyMem_Free(want);
                    want = stack;
                }
            }
            if (ok)
                good++;
            else if (PyList_Append(bad, pos) < 0)
                goto done;
            if (PyList_Append(unpins, PyTuple_GET_ITEM(it, 1)) < 0) goto done;
        }
    }
    out = PyLong_FromSsize_t(good);
done:
    if (nbuf > 2) PyBuffer_Release(&sums);
    if (nbuf > 1) PyBuffer_Release(&hbs);
    if (nbuf > 0) PyBuffer_Release(&res);
    Py_XDECREF(runs);
    Py_XDECREF(keys);
    return out;
}
