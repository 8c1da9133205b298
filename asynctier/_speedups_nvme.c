/* asynctier._speedups, the nvme tier's slot index: a store job's steps on the index, each for
 * the whole job in one call under the index lock. Here those before its writes (evict, free,
 * take free slots, number the writes); those after them and a load job's (end the writes,
 * publish them; pin, unpin), and the checkpointer's step (pack_keys, whose reference is in
 * tiers/nvme/checkpoint.py), are in _speedups_nvme_publish.c; the SlotIndex methods they share
 * in _speedups_nvme_index.c; a job's runs in _speedups_nvme_runs.c.
 *
 * Each function has its Python twin, the reference and the fallback, in
 * asynctier/tiers/nvme/bulk.py, written with the SlotIndex methods it matches
 * (tests/test_c_twins_nvme.py compares the two from random states).
 *
 * The index is a SlotIndex (tiers/nvme/slots.py): its attributes are read by name and checked
 * for their types; its LRU list's head and tail are written back at the end. Every argument
 * is checked before the index changes: a refused call leaves it as it was. */
#include "_speedups_nvme.h"

/* evict_oldest(index, n, more) -> list[(key, slot, seq, 0)]: see bulk.evict_oldest. */
SP_HIDDEN PyObject *evict_oldest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "evict_oldest";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]), more = PyLong_AsSsize_t(args[2]);
    if ((n == -1 || more == -1) && PyErr_Occurred()) return NULL;
    struct index x;
    PyObject *out = NULL;
    long *victims = NULL;
    if (ix_open(&x, args[0], NEED_LRU | NEED_SEQ | NEED_RUNS | NEED_MAP | NEED_PINS, fn) < 0) goto fail;
    /* a valid list has at most nslots victims: clamped so that cap (and its bytes) cannot overflow */
    if (n > x.nslots) n = x.nslots;
    if (more > x.nslots) more = x.nslots;
    /* SlotIndex.oldest_unpinned, nothing changed yet */
    Py_ssize_t cap = (n > 0 ? n : 0) + (more > 0 ? more : 0), m = 0;
    victims = PyMem_Malloc(sizeof(long) * (size_t)(cap > 0 ? cap : 1));
    if (victims == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    long s = x.head;
    while (s >= 0 && m < n) {
        PyObject *o = PyLong_FromLong(s);
        int pin = o ? ix_pinned(&x, o) : -1;
        Py_XDECREF(o);
        if (pin < 0) goto fail;
        if (!pin) victims[m++] = s;
        if ((s = ix_next_of(&x, s, fn)) == -2) goto fail;
    }
    const char *ends = PyByteArray_AS_STRING(x.run_end);
    while (m > 0 && more > 0 && !ends[victims[m - 1]] && s == victims[m - 1] + 1) {
        PyObject *o = PyLong_FromLong(s);
        int pin = o ? ix_pinned(&x, o) : -1;
        Py_XDECREF(o);
        if (pin < 0) goto fail;
        if (pin) break;
        victims[m++] = s;
        if ((s = ix_next_of(&x, s, fn)) == -2) goto fail;
        more--;
    }
    for (Py_ssize_t i = 0; i < m; i++) { /* each victim's key, checked before any is dropped */
        PyObject *k = PyList_GET_ITEM(x.slot_key, victims[i]);
        if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) == 0) {
            PyErr_Format(PyExc_AssertionError, "%s(): slot %ld is in the LRU list without a key", fn, victims[i]);
            goto fail;
        }
    }
    if ((out = PyList_New(m)) == NULL) goto fail;
    for (Py_ssize_t i = 0; i < m; i++) {
        long v = victims[i];
        PyObject *k = PyList_GET_ITEM(x.slot_key, v);
        Py_INCREF(k);
        PyObject *rec = ix_drop(&x, k) < 0 ? NULL : ix_record(k, v, x.seq[v], 0);
        Py_DECREF(k);
        if (rec == NULL) goto fail;
        PyList_SET_ITEM(out, i, rec);
    }
    PyMem_Free(victims);
    ix_close(&x);
    return out;
fail:
    PyMem_Free(victims);
    Py_XDECREF(out);
    ix_close(&x);
    return NULL;
}

/* release_many(index, slots, first_ticket) -> None: see bulk.release_many. */
SP_HIDDEN PyObject *release_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "release_many";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    uint64_t first;
    if (get_u64(args[2], &first) < 0) return NULL;
    PyObject *slots = PySequence_Fast(args[1], "release_many(): slots is a sequence");
    if (slots == NULL) return NULL;
    struct index x;
    int rc = ix_open(&x, args[0], NEED_RELEASE, fn);
    Py_ssize_t m = PySequence_Fast_GET_SIZE(slots);
    if (rc == 0) rc = ix_check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        if (ix_slot_of(&x, PySequence_Fast_GET_ITEM(slots, i), fn) < 0) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        rc = ix_release(&x, PyLong_AsLong(PySequence_Fast_GET_ITEM(slots, i)), first + (uint64_t)i);
    ix_close(&x);
    Py_DECREF(slots);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* begin_writes(index, keys, taken, first_seq) -> int: see bulk.begin_writes. */
SP_HIDDEN PyObject *begin_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "begin_writes";
    if (check_nargs(fn, nargs, 4) < 0) return NULL;
    uint64_t first;
    if (get_u64(args[3], &first) < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[1], "begin_writes(): keys is a sequence");
    PyObject *taken = keys ? PySequence_Fast(args[2], "begin_writes(): taken is a sequence") : NULL;
    struct index x;
    int rc = taken ? ix_open(&x, args[0], NEED_SEQ | NEED_WRITING | NEED_REUSE, fn) : -1;
    Py_ssize_t m = keys ? PySequence_Fast_GET_SIZE(keys) : 0;
    if (rc == 0 && PySequence_Fast_GET_SIZE(taken) != m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys and %zd slots", fn, m, PySequence_Fast_GET_SIZE(taken));
        rc = -1;
    }
    if (rc == 0) rc = ix_check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        if (ix_slot_of(&x, PySequence_Fast_GET_ITEM(taken, i), fn) < 0 ||
            check_key(PySequence_Fast_GET_ITEM(keys, i), fn) < 0)
            rc = -1;
    uint64_t wait = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *so = PySequence_Fast_GET_ITEM(taken, i);
        x.seq[PyLong_AsLong(so)] = first + (uint64_t)i;
        rc = ix_count_write(&x, PySequence_Fast_GET_ITEM(keys, i), 1);
        if (rc == 0 && PyDict_GET_SIZE(x.reuse)) { /* wait = max(reuse.pop(slot, 0), ...) */
            PyObject *t = PyDict_GetItemWithError(x.reuse, so);
            uint64_t u = 0;
            if (t == NULL) {
                if (PyErr_Occurred()) rc = -1;
                continue;
            }
            if (get_u64(t, &u) < 0 || PyDict_DelItem(x.reuse, so) < 0) rc = -1;
            else if (u > wait) wait = u;
        }
    }
    if (taken) ix_close(&x);
    Py_XDECREF(keys);
    Py_XDECREF(taken);
    return rc < 0 ? NULL : PyLong_FromUnsignedLongLong(wait);
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* SlotIndex.mark_runs(taken): taken's runs of adjacent slots noted in run_end. */
static void mark_runs(struct index *x, const long *taken, Py_ssize_t n, long *scratch) {
    if (n == 0) return;
    char *ends = PyByteArray_AS_STRING(x->run_end);
    long lo = taken[0], hi = taken[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (taken[i] < lo) lo = taken[i];
        if (taken[i] > hi) hi = taken[i];
    }
    if (hi - lo == n - 1) { /* one run (slots are distinct) */
        memset(ends + lo, 0, (size_t)(hi - lo));
        ends[hi] = 1;
        return;
    }
    memcpy(scratch, taken, sizeof(long) * (size_t)n);
    qsort(scratch, (size_t)n, sizeof(long), cmp_long);
    for (Py_ssize_t i = 0; i + 1 < n; i++) ends[scratch[i]] = scratch[i + 1] != scratch[i] + 1;
    ends[hi] = 1;
}

/* take_free(index, n, pick_max) -> list[int]: see bulk.take_free (SlotIndex.take_free). */
SP_HIDDEN PyObject *take_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "take_free";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]), pick_max = PyLong_AsSsize_t(args[2]);
    if ((n == -1 || pick_max == -1) && PyErr_Occurred()) return NULL;
    struct index x;
    PyObject *out = NULL, *kept = NULL;
    long *asc = NULL;
    if (ix_open(&x, args[0], NEED_RUNS | NEED_FREE, fn) < 0) goto done;
    Py_ssize_t m = PyList_GET_SIZE(x.free);
    if (n < 0 || n > m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd of %zd free slots", fn, n, m);
        goto done;
    }
    /* A long list is taken from its end as it lies: only those n items are read, so a call
     * costs O(n), not O(free slots) (an empty slab of 400k slots: 1.5 ms a call, all of it
     * on the event loop's thread). A short one (at most pick_max) is read whole and sorted. */
    Py_ssize_t at = (m > pick_max || n >= m) ? -1 : 0; /* where taken starts in asc (sorted), or -1 */
    Py_ssize_t first = at < 0 ? m - n : 0, read = m - first;
    if ((asc = PyMem_Malloc(sizeof(long) * (size_t)(2 * read + 1))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < read; i++)
        if ((asc[i] = ix_slot_of(&x, PyList_GET_ITEM(x.free, first + i), fn)) < 0) goto done;
    long *scratch = asc + read;
    if (at == 0) {
        qsort(asc, (size_t)m, sizeof(long), cmp_long);
        /* the shortest run that holds n (the lowest of those), else the lowest n */
        Py_ssize_t best = -1, best_len = 0;
        for (Py_ssize_t a = 0, b; a < m; a = b) {
            for (b = a + 1; b < m && asc[b] == asc[b - 1] + 1; b++)
                ;
            if (b - a >= n && (best < 0 || b - a < best_len)) {
                best = a;
                best_len = b - a;
            }
        }
        at = best < 0 ? 0 : best;
    }
    if ((out = PyList_New(n)) == NULL) goto done;
    if (at < 0) { /* free[: -n - 1 : -1], then deleted from the list */
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyList_GET_ITEM(x.free, m - 1 - i);
            Py_INCREF(o);
            PyList_SET_ITEM(out, i, o);
            scratch[i] = asc[n - 1 - i]; /* asc holds free[m - n:] */
        }
        if (PyList_SetSlice(x.free, m - n, m, NULL) < 0) goto fail;
        mark_runs(&x, scratch, n, asc); /* (asc is spare by now) */
    } else { /* the rest kept, highest first (low slots popped first) */
        if ((kept = PyList_New(m - n)) == NULL) goto fail;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyLong_FromLong(asc[at + i]);
            if (o == NULL) goto fail;
            PyList_SET_ITEM(out, i, o);
        }
        for (Py_ssize_t i = 0, k = m - n - 1; i < m; i++) {
            if (i >= at && i < at + n) continue;
            PyObject *o = PyLong_FromLong(asc[i]);
            if (o == NULL) goto fail;
            PyList_SET_ITEM(kept, k--, o);
        }
        if (PyList_SetSlice(x.free, 0, m, kept) < 0) goto fail;
        mark_runs(&x, asc + at, n, scratch);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(kept);
    PyMem_Free(asc);
    ix_close(&x);
    return out;
}

