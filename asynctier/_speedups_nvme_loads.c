/* asynctier._speedups, an nvme load job's runs: their READV descriptors and iovecs packed in
 * one call (pack_slot_reads), and each chunk they read checked in one call (runs_loaded),
 * instead of a few Python steps per chunk. Their Python twins, the references and the
 * fallbacks, are in asynctier/tiers/nvme/bulk.py (tests/test_c_twins_nvme.py compares them). */
#include "_speedups.h"

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
