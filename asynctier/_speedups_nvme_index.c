/* asynctier._speedups, the nvme tier's slot index: opening a SlotIndex for one call (its
 * attributes read by name and checked), and the SlotIndex methods the C twins share, each
 * written after the Python method it names (_speedups_nvme.c says more). */
#include "_speedups_nvme.h"

/* The SlotIndex's attribute names, interned once: a call reads only those it uses. */
enum { A_NSLOTS, A_ENTRIES, A_SLOT_KEY, A_FREE, A_REUSE, A_PINS, A_ZOMBIES, A_WRITING, A_KILLED, A_RUN_END,
       A_PREV, A_NXT, A_HEAD, A_TAIL, A_SEQ, A_CSUM, A_TICKET, A_COUNT };
static const char *const attr_names[A_COUNT] = {
    "nslots", "entries", "slot_key", "free", "reuse_ticket", "pins", "zombies", "writing", "killed", "run_end",
    "prev", "nxt", "head", "tail", "slot_seq", "slot_csum", "slot_ticket",
};
static PyObject *attr_str[A_COUNT];

static int intern_attrs(void) {
    for (int i = 0; i < A_COUNT; i++)
        if (attr_str[i] == NULL && (attr_str[i] = PyUnicode_InternFromString(attr_names[i])) == NULL) return -1;
    return 0;
}

/* The index's attribute `a`, checked to be of `type` (a new reference), into *out. */
static int attr(struct index *x, int a, PyTypeObject *type, PyObject **out, const char *fn) {
    PyObject *v = PyObject_GetAttr(x->obj, attr_str[a]);
    if (v != NULL && !Py_IS_TYPE(v, type)) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's %s is a %s, not %.50s", fn, attr_names[a], type->tp_name,
                     Py_TYPE(v)->tp_name);
        Py_CLEAR(v);
    }
    *out = v;
    return v == NULL ? -1 : 0;
}

/* One per-slot array of the index (an array.array of `code`, nslots long) into *out. */
static int array_of(struct index *x, int a, char code, Py_ssize_t size, void **out, const char *fn) {
    PyObject *v = PyObject_GetAttr(x->obj, attr_str[a]);
    if (v == NULL) return -1;
    Py_buffer *b = &x->bufs[x->nbufs];
    int rc = PyObject_GetBuffer(v, b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS);
    Py_DECREF(v);
    if (rc < 0) return -1;
    x->nbufs++;
    if (b->itemsize != size || b->format == NULL || b->format[0] != code || b->format[1] != 0 ||
        b->len != x->nslots * size) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's %s is an array('%c') of %zd items, not one of format %s, %zd bytes",
                     fn, attr_names[a], code, x->nslots, b->format ? b->format : "B", b->len);
        return -1;
    }
    *out = b->buf;
    return 0;
}

SP_HIDDEN void ix_close(struct index *x) {
    if (x->moved) {
        PyObject *h = PyLong_FromLong(x->head), *t = PyLong_FromLong(x->tail);
        if (h == NULL || t == NULL || PyObject_SetAttr(x->obj, attr_str[A_HEAD], h) < 0 ||
            PyObject_SetAttr(x->obj, attr_str[A_TAIL], t) < 0)
            PyErr_WriteUnraisable(x->obj); /* only memory running out gets here */
        Py_XDECREF(h);
        Py_XDECREF(t);
    }
    for (int i = 0; i < x->nbufs; i++) PyBuffer_Release(&x->bufs[i]);
    Py_XDECREF(x->entries);
    Py_XDECREF(x->slot_key);
    Py_XDECREF(x->free);
    Py_XDECREF(x->reuse);
    Py_XDECREF(x->pins);
    Py_XDECREF(x->zombies);
    Py_XDECREF(x->writing);
    Py_XDECREF(x->killed);
    Py_XDECREF(x->run_end);
}

/* An int attribute of the index; -2 with an error. */
static long long_attr(struct index *x, int a) {
    PyObject *v = PyObject_GetAttr(x->obj, attr_str[a]);
    if (v == NULL) return -2;
    long r = PyLong_AsLong(v);
    Py_DECREF(v);
    return r == -1 && PyErr_Occurred() ? -2 : r;
}

/* Open x over the SlotIndex obj, reading what `need` names; -1 with an error (then
 * ix_close it all the same). */
SP_HIDDEN int ix_open(struct index *x, PyObject *obj, int need, const char *fn) {
    memset(x, 0, sizeof *x);
    x->obj = obj;
    if (intern_attrs() < 0) return -1;
    long n = long_attr(x, A_NSLOTS);
    if (n < 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s(): the index has %ld slots", fn, n);
        return -1;
    }
    x->nslots = n;
    if ((need & NEED_MAP) &&
        (attr(x, A_ENTRIES, &PyDict_Type, &x->entries, fn) < 0 || attr(x, A_SLOT_KEY, &PyList_Type, &x->slot_key, fn) < 0))
        return -1;
    if (x->slot_key && PyList_GET_SIZE(x->slot_key) != x->nslots) {
        PyErr_Format(PyExc_ValueError, "%s(): the index's slot_key has %zd items, not %zd", fn,
                     PyList_GET_SIZE(x->slot_key), x->nslots);
        return -1;
    }
    if (((need & NEED_FREE) && attr(x, A_FREE, &PyList_Type, &x->free, fn) < 0) ||
        ((need & NEED_REUSE) && attr(x, A_REUSE, &PyDict_Type, &x->reuse, fn) < 0) ||
        ((need & NEED_PINS) && attr(x, A_PINS, &PyDict_Type, &x->pins, fn) < 0) ||
        ((need & NEED_ZOMBIES) && attr(x, A_ZOMBIES, &PyDict_Type, &x->zombies, fn) < 0) ||
        ((need & NEED_WRITING) &&
         (attr(x, A_WRITING, &PyDict_Type, &x->writing, fn) < 0 || attr(x, A_KILLED, &PyDict_Type, &x->killed, fn) < 0)))
        return -1;
    if (need & NEED_LRU) {
        if (array_of(x, A_PREV, 'i', 4, (void **)&x->prev, fn) < 0 || array_of(x, A_NXT, 'i', 4, (void **)&x->nxt, fn) < 0)
            return -1;
        if ((x->head = long_attr(x, A_HEAD)) < -1 || (x->tail = long_attr(x, A_TAIL)) < -1 || x->head >= x->nslots ||
            x->tail >= x->nslots) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s(): the index's LRU ends are out of range", fn);
            return -1;
        }
    }
    if ((need & NEED_SEQ) && array_of(x, A_SEQ, 'Q', 8, (void **)&x->seq, fn) < 0) return -1;
    if ((need & NEED_CSUM) && array_of(x, A_CSUM, 'Q', 8, (void **)&x->csum, fn) < 0) return -1;
    if ((need & NEED_TICKET) && array_of(x, A_TICKET, 'Q', 8, (void **)&x->ticket, fn) < 0) return -1;
    if (need & NEED_RUNS) {
        if (attr(x, A_RUN_END, &PyByteArray_Type, &x->run_end, fn) < 0) return -1;
        if (PyByteArray_GET_SIZE(x->run_end) != x->nslots) {
            PyErr_Format(PyExc_ValueError, "%s(): the index's run_end has %zd bytes, not %zd", fn,
                         PyByteArray_GET_SIZE(x->run_end), x->nslots);
            return -1;
        }
    }
    return 0;
}

/* Write the LRU list's ends back to the index object, which has them from now on (a Python
 * method called next moves them): 0, or -1 with an error. */
SP_HIDDEN int ix_hand_ends(struct index *x) {
    PyObject *h = PyLong_FromLong(x->head), *t = PyLong_FromLong(x->tail);
    int rc = h && t && PyObject_SetAttr(x->obj, attr_str[A_HEAD], h) == 0 &&
                     PyObject_SetAttr(x->obj, attr_str[A_TAIL], t) == 0
                 ? 0
                 : -1;
    Py_XDECREF(h);
    Py_XDECREF(t);
    if (rc == 0) x->moved = 0; /* the object's now: not written back by ix_close */
    return rc;
}

/* Read the ends back after such a method, checked with slot_key's size: 0, or -1 with an error. */
SP_HIDDEN int ix_take_ends(struct index *x, const char *fn) {
    if ((x->head = long_attr(x, A_HEAD)) < -1 || (x->tail = long_attr(x, A_TAIL)) < -1 || x->head >= x->nslots ||
        x->tail >= x->nslots || PyList_GET_SIZE(x->slot_key) != x->nslots) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s(): the index's LRU ends or slot_key are out of range", fn);
        return -1;
    }
    return 0;
}

/* A slot number in range, from an exact int (converting anything else would run its
 * __index__, Python code that may change the lists read here); -1 with an error. */
SP_HIDDEN long ix_slot_of(struct index *x, PyObject *v, const char *fn) {
    long long s;
    if (get_ll(v, &s) < 0) return -1;
    if (s < 0 || s >= x->nslots) {
        PyErr_Format(PyExc_IndexError, "%s(): slot %lld of an index of %zd", fn, s, x->nslots);
        return -1;
    }
    return (long)s;
}

/* 0 if the numbers first .. first + m - 1 (tickets, sequence numbers) fit 64 bits, else -1
 * with OverflowError: refused before any change rather than wrapped. */
SP_HIDDEN int ix_check_u64_range(uint64_t first, Py_ssize_t m, const char *fn) {
    if (m > 0 && (uint64_t)(m - 1) > UINT64_MAX - first) {
        PyErr_Format(PyExc_OverflowError, "%s(): %zd numbers from %llu pass 2**64 - 1", fn, m,
                     (unsigned long long)first);
        return -1;
    }
    return 0;
}

/* The linked list's next slot after s, checked; -2 with an error. */
SP_HIDDEN long ix_next_of(struct index *x, long s, const char *fn) {
    long q = x->nxt[s];
    if (q < -1 || q >= x->nslots) {
        PyErr_Format(PyExc_ValueError, "%s(): the index's LRU list is broken at slot %ld", fn, s);
        return -2;
    }
    return q;
}

/* SlotIndex._unlink: 0, or -1 with an error if s's links are out of range (an index that
 * lost its consistency is refused, never written outside its arrays). */
SP_HIDDEN int ix_unlink(struct index *x, long s) {
    long p = x->prev[s], q = x->nxt[s];
    if (p < -1 || p >= x->nslots || q < -1 || q >= x->nslots) {
        PyErr_Format(PyExc_ValueError, "the index's LRU list is broken at slot %ld", s);
        return -1;
    }
    if (p >= 0) x->nxt[p] = (int32_t)q;
    else x->head = q;
    if (q >= 0) x->prev[q] = (int32_t)p;
    else x->tail = p;
    x->prev[s] = x->nxt[s] = -1;
    x->moved = 1;
    return 0;
}

SP_HIDDEN void ix_link_tail(struct index *x, long s) { /* SlotIndex._link_tail */
    long t = x->tail;
    x->prev[s] = (int32_t)t;
    x->nxt[s] = -1;
    if (t >= 0) x->nxt[t] = (int32_t)s;
    else x->head = s;
    x->tail = s;
    x->moved = 1;
}

/* 1 if slot s is pinned (pins.get(s) is true), 0 if not, -1 with an error. */
SP_HIDDEN int ix_pinned(struct index *x, PyObject *s) {
    if (PyDict_GET_SIZE(x->pins) == 0) return 0;
    PyObject *v = PyDict_GetItemWithError(x->pins, s);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    return PyObject_IsTrue(v);
}

/* SlotIndex.release(slot, ticket): 0, or -1 with an error. */
SP_HIDDEN int ix_release(struct index *x, long slot, uint64_t ticket) {
    PyObject *s = PyLong_FromLong(slot), *t = NULL;
    int rc = -1, pin = s ? ix_pinned(x, s) : -1;
    if (pin < 0) goto done;
    if (pin) { /* freed once unpinned: zombies[slot] = max(ticket, zombies.get(slot, 0)) */
        PyObject *old = PyDict_GetItemWithError(x->zombies, s);
        if (old == NULL && PyErr_Occurred()) goto done;
        uint64_t was = 0;
        if (old != NULL && get_u64(old, &was) < 0) goto done;
        if (old != NULL && was >= ticket) {
            rc = 0;
            goto done;
        }
        t = PyLong_FromUnsignedLongLong(ticket);
        rc = t ? PyDict_SetItem(x->zombies, s, t) : -1;
        goto done;
    }
    if (ticket) {
        t = PyLong_FromUnsignedLongLong(ticket);
        if (t == NULL || PyDict_SetItem(x->reuse, s, t) < 0) goto done;
    }
    rc = PyList_Append(x->free, s);
done:
    Py_XDECREF(s);
    Py_XDECREF(t);
    return rc;
}

/* SlotIndex.drop(key): 0, or -1 with an error. */
SP_HIDDEN int ix_drop(struct index *x, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(x->entries, key);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(v);
    long long s;
    int rc = -1;
    if (get_ll(v, &s) < 0) goto done;
    if (s < 0 || s >= x->nslots) {
        PyErr_Format(PyExc_ValueError, "the index maps a key to slot %lld of %zd", s, x->nslots);
        goto done;
    }
    if (ix_unlink(x, (long)s) < 0 || PyDict_DelItem(x->entries, key) < 0) goto done;
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    /* steals empty (even when it fails), drops the key's reference */
    if (empty == NULL || PyList_SetItem(x->slot_key, (Py_ssize_t)s, empty) < 0) goto done;
    rc = 0;
done:
    Py_DECREF(v);
    return rc;
}

SP_HIDDEN PyObject *ix_record(PyObject *key, long slot, uint64_t seq, uint64_t csum) {
    Py_INCREF(key);
    PyObject *items[4] = {key, PyLong_FromLong(slot), PyLong_FromUnsignedLongLong(seq), PyLong_FromUnsignedLongLong(csum)};
    return tuple_of(4, items);
}

/* writing[key] += by (by: 1 or -1; at 0 the key leaves `writing`, and `killed` with it). */
SP_HIDDEN int ix_count_write(struct index *x, PyObject *key, long by) {
    PyObject *v = PyDict_GetItemWithError(x->writing, key);
    if (v == NULL && PyErr_Occurred()) return -1;
    long n = v == NULL ? 0 : PyLong_AsLong(v);
    if (n == -1 && PyErr_Occurred()) return -1;
    n += by;
    if (n > 0) {
        PyObject *c = PyLong_FromLong(n);
        int rc = c ? PyDict_SetItem(x->writing, key, c) : -1;
        Py_XDECREF(c);
        return rc;
    }
    if (v != NULL && PyDict_DelItem(x->writing, key) < 0) return -1;
    int killed = PyDict_GET_SIZE(x->killed) ? PyDict_Contains(x->killed, key) : 0;
    return killed < 0 || (killed && PyDict_DelItem(x->killed, key) < 0) ? -1 : 0;
}
