/* asynctier._speedups, the nvme tier's slot index after a store job's writes (end them,
 * publish them) and around a load job's (pin, unpin), each for the whole job in one call under
 * the index lock; last, the checkpointer's step (pack_keys). _speedups_nvme.c says more. */
#include "_speedups_nvme.h"

/* 1 if a write numbered seq is killed by the value kv of killed[key] (seq <= kv, as the
 * reference compares: a negative kv kills none, one past 2**64 - 1 all), 0 if not, -1 with an error. */
static int killed_at(PyObject *kv, uint64_t seq) {
    if (need_int(kv) < 0) return -1;
    int over;
    long long k = PyLong_AsLongLongAndOverflow(kv, &over);
    if (k == -1 && PyErr_Occurred()) return -1;
    if (over < 0 || (over == 0 && k < 0)) return 0;
    uint64_t u;
    if (get_u64(kv, &u) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        return 1;
    }
    return seq <= u;
}

/* end_writes(index, keys, written, slots, csums) -> list[(key, slot, seq, csum)]: see
 * bulk.end_writes. csums[p] is read as the reference reads it, only for a write that gets a
 * record: a missing or bad one fails there, leaving the index as the reference leaves it. */
SP_HIDDEN PyObject *end_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "end_writes";
    if (check_nargs(fn, nargs, 5) < 0) return NULL;
    PyObject *slots = args[3], *csums = args[4], *out = NULL;
    if (!PyDict_Check(slots) || !PyDict_Check(csums)) {
        PyErr_Format(PyExc_TypeError, "%s(): slots and csums are dicts by position", fn);
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[1], "end_writes(): keys is a sequence");
    PyObject *written = keys ? PySequence_Fast(args[2], "end_writes(): written is a sequence") : NULL;
    if (written == NULL) {
        Py_XDECREF(keys);
        return NULL;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(written), nk = PySequence_Fast_GET_SIZE(keys);
    struct {
        PyObject *key, *csum; /* csum: csums.get(p), read only for a write that gets a record */
        Py_ssize_t pos;
        long slot;
        uint64_t seq;
    } *w = PyMem_Malloc(sizeof *w * (size_t)(m > 0 ? m : 1));
    struct index x;
    int rc = -1;
    if (w == NULL) PyErr_NoMemory();
    else rc = ix_open(&x, args[0], NEED_CSUM | NEED_WRITING | NEED_RELEASE, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) { /* every argument checked first */
        PyObject *p = PySequence_Fast_GET_ITEM(written, i), *sl;
        rc = -1;
        if (need_int(p) < 0) break;
        Py_ssize_t pos = PyLong_AsSsize_t(p);
        if (pos == -1 && PyErr_Occurred()) break;
        if (pos < 0 || pos >= nk) {
            PyErr_Format(PyExc_IndexError, "%s(): position %zd of %zd keys", fn, pos, nk);
            break;
        }
        w[i].key = PySequence_Fast_GET_ITEM(keys, pos);
        if (check_key(w[i].key, fn) < 0) break;
        w[i].pos = pos;
        if ((sl = PyDict_GetItemWithError(slots, p)) == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s(): no slot or checksum for position %zd", fn, pos);
            break;
        }
        if (!PyTuple_Check(sl) || PyTuple_GET_SIZE(sl) != 2) {
            PyErr_Format(PyExc_TypeError, "%s(): slots[%zd] is a (slot, seq) tuple", fn, pos);
            break;
        }
        if ((w[i].slot = ix_slot_of(&x, PyTuple_GET_ITEM(sl, 0), fn)) < 0 || get_u64(PyTuple_GET_ITEM(sl, 1), &w[i].seq) < 0)
            break;
        if ((w[i].csum = PyDict_GetItemWithError(csums, p)) == NULL && PyErr_Occurred()) break;
        rc = 0;
    }
    if (rc == 0 && (out = PyList_New(0)) == NULL) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *key = w[i].key, *rec;
        /* SlotIndex.done_writing: killed is seq <= killed.get(key, -1) */
        PyObject *kv = PyDict_GET_SIZE(x.killed) ? PyDict_GetItemWithError(x.killed, key) : NULL;
        if (kv == NULL && PyErr_Occurred()) {
            rc = -1;
            break;
        }
        int killed = kv != NULL ? killed_at(kv, w[i].seq) : 0;
        if (killed < 0 || ix_count_write(&x, key, -1) < 0) {
            rc = -1;
            break;
        }
        if (killed) {
            rc = ix_release(&x, w[i].slot, 0);
            continue;
        }
        /* csums[p] as the reference reads it: only here, a missing or bad one fails here */
        uint64_t csum;
        if (w[i].csum == NULL) {
            PyErr_Format(PyExc_KeyError, "%s(): no slot or checksum for position %zd", fn, w[i].pos);
            rc = -1;
            break;
        }
        if (get_u64(w[i].csum, &csum) < 0) {
            rc = -1;
            break;
        }
        x.csum[w[i].slot] = csum;
        if ((rec = ix_record(key, w[i].slot, w[i].seq, csum)) == NULL || PyList_Append(out, rec) < 0) rc = -1;
        Py_XDECREF(rec);
    }
    if (w) ix_close(&x);
    PyMem_Free(w);
    Py_DECREF(keys);
    Py_DECREF(written);
    if (rc < 0) Py_CLEAR(out);
    return out;
}

/* put_published(index, recs, first_ticket) -> list[(position, old slot)]: see
 * bulk.put_published. */
SP_HIDDEN PyObject *put_published(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "put_published";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    uint64_t first;
    if (get_u64(args[2], &first) < 0) return NULL;
    /* a tuple of our own: SlotIndex.put (Python) runs midway, and the records stay ours through it */
    PyObject *recs = PySequence_Tuple(args[1]), *had = NULL;
    if (recs == NULL) return NULL;
    struct index x;
    int rc = ix_open(&x, args[0], NEED_LRU | NEED_TICKET | NEED_MAP, fn);
    Py_ssize_t m = PyTuple_GET_SIZE(recs);
    if (rc == 0) rc = ix_check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *r = PyTuple_GET_ITEM(recs, i);
        rc = -1;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
            PyErr_Format(PyExc_TypeError, "%s(): recs[%zd] is a (key, slot, seq, csum) tuple", fn, i);
            break;
        }
        if (check_key(PyTuple_GET_ITEM(r, 0), fn) < 0 || ix_slot_of(&x, PyTuple_GET_ITEM(r, 1), fn) < 0) break;
        rc = 0;
    }
    if (rc == 0 && (had = PyList_New(0)) == NULL) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *r = PyTuple_GET_ITEM(recs, i), *key = PyTuple_GET_ITEM(r, 0), *so = PyTuple_GET_ITEM(r, 1);
        long s = PyLong_AsLong(so);
        x.ticket[s] = first + (uint64_t)i;
        PyObject *cur = PyList_GET_ITEM(x.slot_key, s);
        int known = PyDict_Contains(x.entries, key);
        if (known < 0) {
            rc = -1;
            break;
        }
        if (known || !PyBytes_Check(cur) || PyBytes_GET_SIZE(cur) != 0) {
            /* the general case: SlotIndex.put itself, with the LRU ends handed over */
            PyObject *old = NULL;
            if (ix_hand_ends(&x) == 0) old = PyObject_CallMethod(x.obj, "put", "OO", key, so);
            if (old == NULL || ix_take_ends(&x, fn) < 0) {
                Py_XDECREF(old);
                rc = -1;
                break;
            }
            if (old != Py_None) {
                PyObject *pair = Py_BuildValue("(nO)", i, old);
                if (pair == NULL || PyList_Append(had, pair) < 0) rc = -1;
                Py_XDECREF(pair);
            }
            Py_DECREF(old);
            continue;
        }
        if (PyDict_SetItem(x.entries, key, so) < 0) {
            rc = -1;
            break;
        }
        Py_INCREF(key);
        if (PyList_SetItem(x.slot_key, s, key) < 0) { /* steals the new reference, drops b"" */
            rc = -1;
            break;
        }
        ix_link_tail(&x, s);
    }
    ix_close(&x);
    Py_DECREF(recs);
    if (rc < 0) Py_CLEAR(had);
    return had;
}

/* pin_many(index, keys) -> (dict[position, (slot, seq, csum)], list[position]): see
 * bulk.pin_many. */
SP_HIDDEN PyObject *pin_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pin_many";
    if (check_nargs(fn, nargs, 2) < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[1], "pin_many(): keys is a sequence"), *found = NULL, *missing = NULL;
    if (keys == NULL) return NULL;
    struct index x;
    int rc = ix_open(&x, args[0], NEED_LRU | NEED_SEQ | NEED_CSUM | NEED_MAP | NEED_PINS, fn);
    Py_ssize_t m = PySequence_Fast_GET_SIZE(keys);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        if (check_key(PySequence_Fast_GET_ITEM(keys, i), fn) < 0) rc = -1;
    if (rc == 0 && (!(found = PyDict_New()) || !(missing = PyList_New(0)))) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *so = PyDict_GetItemWithError(x.entries, PySequence_Fast_GET_ITEM(keys, i)), *pos = NULL, *v = NULL;
        if (so == NULL) {
            if (PyErr_Occurred() || !(pos = PyLong_FromSsize_t(i)) || PyList_Append(missing, pos) < 0) rc = -1;
            Py_XDECREF(pos);
            continue;
        }
        long s = ix_slot_of(&x, so, fn);
        if (s < 0) {
            rc = -1;
            break;
        }
        if (x.tail != s) { /* SlotIndex.touch_slot */
            if (ix_unlink(&x, s) < 0) {
                rc = -1;
                break;
            }
            ix_link_tail(&x, s);
        }
        PyObject *had = PyDict_GetItemWithError(x.pins, so);
        long n = had == NULL ? 0 : PyLong_AsLong(had);
        if ((had == NULL && PyErr_Occurred()) || (n == -1 && PyErr_Occurred())) {
            rc = -1;
            break;
        }
        PyObject *cnt = PyLong_FromLong(n + 1);
        if (cnt == NULL || PyDict_SetItem(x.pins, so, cnt) < 0 || !(pos = PyLong_FromSsize_t(i)) ||
            !(v = tuple_of(3, (PyObject *[]){Py_NewRef(so), PyLong_FromUnsignedLongLong(x.seq[s]),
                                               PyLong_FromUnsignedLongLong(x.csum[s])})) ||
            PyDict_SetItem(found, pos, v) < 0)
            rc = -1;
        Py_XDECREF(cnt);
        Py_XDECREF(pos);
        Py_XDECREF(v);
    }
    ix_close(&x);
    Py_DECREF(keys);
    PyObject *out = rc == 0 ? PyTuple_Pack(2, found, missing) : NULL;
    Py_XDECREF(found);
    Py_XDECREF(missing);
    return out;
}

/* unpin_many(index, slots) -> None: see bulk.unpin_many (SlotIndex.unpin_many). */
SP_HIDDEN PyObject *unpin_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "unpin_many";
    if (check_nargs(fn, nargs, 2) < 0) return NULL;
    PyObject *slots = PySequence_Fast(args[1], "unpin_many(): slots is a sequence");
    if (slots == NULL) return NULL;
    struct index x;
    int rc = ix_open(&x, args[0], NEED_RELEASE, fn);
    Py_ssize_t m = PySequence_Fast_GET_SIZE(slots);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) { /* each pinned (one pinned fewer times than it comes fails on the way) */
        PyObject *so = PySequence_Fast_GET_ITEM(slots, i);
        if (ix_slot_of(&x, so, fn) < 0) rc = -1;
        else if (PyDict_GetItemWithError(x.pins, so) == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s(): slot %ld is not pinned", fn, PyLong_AsLong(so));
            rc = -1;
        }
    }
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *so = PySequence_Fast_GET_ITEM(slots, i), *had = PyDict_GetItemWithError(x.pins, so);
        if (had == NULL) { /* unpinned to 0 by an earlier item: as pins[slot] raises */
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "%s(): slot %ld is not pinned", fn, PyLong_AsLong(so));
            rc = -1;
            break;
        }
        long n = PyLong_AsLong(had) - 1;
        if (n == -2 && PyErr_Occurred()) {
            rc = -1;
            break;
        }
        if (n) {
            PyObject *cnt = PyLong_FromLong(n);
            rc = cnt ? PyDict_SetItem(x.pins, so, cnt) : -1;
            Py_XDECREF(cnt);
            continue;
        }
        if (PyDict_DelItem(x.pins, so) < 0) {
            rc = -1;
            break;
        }
        if (PyDict_GET_SIZE(x.zombies)) { /* freed while pinned: freed now */
            PyObject *t = PyDict_GetItemWithError(x.zombies, so);
            uint64_t u;
            if (t == NULL) {
                if (PyErr_Occurred()) rc = -1;
                continue;
            }
            Py_INCREF(t);
            rc = get_u64(t, &u) < 0 || PyDict_DelItem(x.zombies, so) < 0 ? -1 : ix_release(&x, PyLong_AsLong(so), u);
            Py_DECREF(t);
        }
    }
    ix_close(&x);
    Py_DECREF(slots);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* pack_keys(keys, start, stop) -> (lengths, joined): see checkpoint.pack_keys. keys[start:stop]
 * as a checkpoint stores them, each length a native uint16, the keys joined: a step of the
 * checkpointer's, holding the GIL, in place of array("H", map(len, ...)) and b"".join(...),
 * which read each key twice and ran Python's per-item calls. */
SP_HIDDEN PyObject *pack_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_keys";
    if (check_nargs(fn, nargs, 3) < 0) return NULL;
    if (!PyList_CheckExact(args[0])) {
        PyErr_Format(PyExc_TypeError, "%s(): keys must be a list, not %.50s", fn, Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *keys = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    if (start < 0 || stop < start || stop > PyList_GET_SIZE(keys)) {
        PyErr_Format(PyExc_ValueError, "%s(): keys[%zd:%zd] of a list of %zd", fn, start, stop, PyList_GET_SIZE(keys));
        return NULL;
    }
    /* One pass over the keys (each a cache miss in a large index), copied into a buffer grown
     * as needed, the next few fetched ahead. */
    Py_ssize_t n = stop - start, cap = 32 * n + 64, used = 0;
    uint16_t *lens = PyMem_Malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    char *buf = PyMem_Malloc((size_t)cap);
    PyObject *out = NULL;
    if (lens == NULL || buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = start; i < stop; i++) {
#if defined(__GNUC__)
        if (i + 8 < stop) __builtin_prefetch(PyList_GET_ITEM(keys, i + 8));
#endif
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(k)) {
            PyErr_Format(PyExc_TypeError, "%s(): keys[%zd] is a %.50s, not bytes", fn, i, Py_TYPE(k)->tp_name);
            goto done;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(k);
        if (len > UINT16_MAX) {
            PyErr_Format(PyExc_OverflowError, "%s(): keys[%zd] is %zd bytes long; at most %d fit", fn, i, len,
                         UINT16_MAX);
            goto done;
        }
        if (used + len > cap) {
            char *more = PyMem_Realloc(buf, (size_t)(cap = 2 * cap + len));
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            buf = more;
        }
        lens[i - start] = (uint16_t)len;
        memcpy(buf + used, PyBytes_AS_STRING(k), (size_t)len);
        used += len;
    }
    PyObject *lb = PyBytes_FromStringAndSize((const char *)lens, 2 * n);
    PyObject *jb = lb ? PyBytes_FromStringAndSize(buf, used) : NULL;
    if (jb != NULL) out = PyTuple_Pack(2, lb, jb);
    Py_XDECREF(lb);
    Py_XDECREF(jb);
done:
    PyMem_Free(lens);
    PyMem_Free(buf);
    return out;
}
