/* asynctier._speedups, the nvme tier's slot index: a store job's steps on the index (evict,
 * number the writes, end them, publish them) and a load job's (pin, unpin), each for the
 * whole job in one call under the index lock (a job's runs: _speedups_nvme_runs.c). Each function has its Python twin, the reference and the fallback, in
 * asynctier/tiers/nvme/bulk.py, written with the SlotIndex methods it matches
 * (tests/test_c_twins_nvme.py compares the two from random states).
 *
 * The index is a SlotIndex (tiers/nvme/slots.py): its attributes are read here by name and
 * checked for their types; its LRU list's head and tail are written back at the end. Every
 * argument is checked before the index changes: a refused call leaves it as it was.
 *
 * Last, the checkpointer's step (pack_keys), whose reference is in tiers/nvme/checkpoint.py. */
#include "_speedups.h"

/* What a call uses of the SlotIndex: new references to its containers, its arrays' buffers,
 * the LRU list's ends (written back by index_close when `moved`). */
struct index {
    PyObject *obj;
    Py_ssize_t nslots;
    PyObject *entries, *slot_key, *free, *reuse, *pins, *zombies, *writing, *killed, *run_end;
    Py_buffer bufs[5];
    int nbufs;
    int32_t *prev, *nxt;
    uint64_t *seq, *csum, *ticket;
    long head, tail;
    int moved;
};

enum {
    NEED_LRU = 1, NEED_SEQ = 2, NEED_CSUM = 4, NEED_TICKET = 8, NEED_RUNS = 16,
    NEED_MAP = 32, NEED_FREE = 64, NEED_REUSE = 128, NEED_PINS = 256, NEED_ZOMBIES = 512, NEED_WRITING = 1024,
    NEED_RELEASE = NEED_FREE | NEED_REUSE | NEED_PINS | NEED_ZOMBIES, /* (release()) */
};

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

static void index_close(struct index *x) {
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
 * index_close it all the same). */
static int index_open(struct index *x, PyObject *obj, int need, const char *fn) {
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

/* A slot number in range, from an exact int (converting anything else would run its
 * __index__, Python code that may change the lists read here); -1 with an error. */
static long slot_of(struct index *x, PyObject *v, const char *fn) {
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
static int check_u64_range(uint64_t first, Py_ssize_t m, const char *fn) {
    if (m > 0 && (uint64_t)(m - 1) > UINT64_MAX - first) {
        PyErr_Format(PyExc_OverflowError, "%s(): %zd numbers from %llu pass 2**64 - 1", fn, m,
                     (unsigned long long)first);
        return -1;
    }
    return 0;
}

/* The linked list's next slot after s, checked; -2 with an error. */
static long next_of(struct index *x, long s, const char *fn) {
    long q = x->nxt[s];
    if (q < -1 || q >= x->nslots) {
        PyErr_Format(PyExc_ValueError, "%s(): the index's LRU list is broken at slot %ld", fn, s);
        return -2;
    }
    return q;
}

/* SlotIndex._unlink: 0, or -1 with an error if s's links are out of range (an index that
 * lost its consistency is refused, never written outside its arrays). */
static int unlink_slot(struct index *x, long s) {
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

static void link_tail(struct index *x, long s) { /* SlotIndex._link_tail */
    long t = x->tail;
    x->prev[s] = (int32_t)t;
    x->nxt[s] = -1;
    if (t >= 0) x->nxt[t] = (int32_t)s;
    else x->head = s;
    x->tail = s;
    x->moved = 1;
}

/* 1 if slot s is pinned (pins.get(s) is true), 0 if not, -1 with an error. */
static int pinned(struct index *x, PyObject *s) {
    if (PyDict_GET_SIZE(x->pins) == 0) return 0;
    PyObject *v = PyDict_GetItemWithError(x->pins, s);
    if (v == NULL) return PyErr_Occurred() ? -1 : 0;
    return PyObject_IsTrue(v);
}

/* SlotIndex.release(slot, ticket): 0, or -1 with an error. */
static int release(struct index *x, long slot, uint64_t ticket) {
    PyObject *s = PyLong_FromLong(slot), *t = NULL;
    int rc = -1, pin = s ? pinned(x, s) : -1;
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
static int drop(struct index *x, PyObject *key) {
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
    if (unlink_slot(x, (long)s) < 0 || PyDict_DelItem(x->entries, key) < 0) goto done;
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    /* steals empty (even when it fails), drops the key's reference */
    if (empty == NULL || PyList_SetItem(x->slot_key, (Py_ssize_t)s, empty) < 0) goto done;
    rc = 0;
done:
    Py_DECREF(v);
    return rc;
}

static PyObject *record(PyObject *key, long slot, uint64_t seq, uint64_t csum) {
    return Py_BuildValue("(OlKK)", key, slot, (unsigned long long)seq, (unsigned long long)csum);
}

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
    if (index_open(&x, args[0], NEED_LRU | NEED_SEQ | NEED_RUNS | NEED_MAP | NEED_PINS, fn) < 0) goto fail;
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
        int pin = o ? pinned(&x, o) : -1;
        Py_XDECREF(o);
        if (pin < 0) goto fail;
        if (!pin) victims[m++] = s;
        if ((s = next_of(&x, s, fn)) == -2) goto fail;
    }
    const char *ends = PyByteArray_AS_STRING(x.run_end);
    while (m > 0 && more > 0 && !ends[victims[m - 1]] && s == victims[m - 1] + 1) {
        PyObject *o = PyLong_FromLong(s);
        int pin = o ? pinned(&x, o) : -1;
        Py_XDECREF(o);
        if (pin < 0) goto fail;
        if (pin) break;
        victims[m++] = s;
        if ((s = next_of(&x, s, fn)) == -2) goto fail;
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
        PyObject *rec = drop(&x, k) < 0 ? NULL : record(k, v, x.seq[v], 0);
        Py_DECREF(k);
        if (rec == NULL) goto fail;
        PyList_SET_ITEM(out, i, rec);
    }
    PyMem_Free(victims);
    index_close(&x);
    return out;
fail:
    PyMem_Free(victims);
    Py_XDECREF(out);
    index_close(&x);
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
    int rc = index_open(&x, args[0], NEED_RELEASE, fn);
    Py_ssize_t m = PySequence_Fast_GET_SIZE(slots);
    if (rc == 0) rc = check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        if (slot_of(&x, PySequence_Fast_GET_ITEM(slots, i), fn) < 0) rc = -1;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        rc = release(&x, PyLong_AsLong(PySequence_Fast_GET_ITEM(slots, i)), first + (uint64_t)i);
    index_close(&x);
    Py_DECREF(slots);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* writing[key] += by (by: 1 or -1; at 0 the key leaves `writing`, and `killed` with it). */
static int count_write(struct index *x, PyObject *key, long by) {
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
    int rc = taken ? index_open(&x, args[0], NEED_SEQ | NEED_WRITING | NEED_REUSE, fn) : -1;
    Py_ssize_t m = keys ? PySequence_Fast_GET_SIZE(keys) : 0;
    if (rc == 0 && PySequence_Fast_GET_SIZE(taken) != m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys and %zd slots", fn, m, PySequence_Fast_GET_SIZE(taken));
        rc = -1;
    }
    if (rc == 0) rc = check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++)
        if (slot_of(&x, PySequence_Fast_GET_ITEM(taken, i), fn) < 0 ||
            check_key(PySequence_Fast_GET_ITEM(keys, i), fn) < 0)
            rc = -1;
    uint64_t wait = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *so = PySequence_Fast_GET_ITEM(taken, i);
        x.seq[PyLong_AsLong(so)] = first + (uint64_t)i;
        rc = count_write(&x, PySequence_Fast_GET_ITEM(keys, i), 1);
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
    if (taken) index_close(&x);
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
    if (index_open(&x, args[0], NEED_RUNS | NEED_FREE, fn) < 0) goto done;
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
        if ((asc[i] = slot_of(&x, PyList_GET_ITEM(x.free, first + i), fn)) < 0) goto done;
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
    index_close(&x);
    return out;
}

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
    else rc = index_open(&x, args[0], NEED_CSUM | NEED_WRITING | NEED_RELEASE, fn);
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
        if ((w[i].slot = slot_of(&x, PyTuple_GET_ITEM(sl, 0), fn)) < 0 || get_u64(PyTuple_GET_ITEM(sl, 1), &w[i].seq) < 0)
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
        if (killed < 0 || count_write(&x, key, -1) < 0) {
            rc = -1;
            break;
        }
        if (killed) {
            rc = release(&x, w[i].slot, 0);
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
        if ((rec = record(key, w[i].slot, w[i].seq, csum)) == NULL || PyList_Append(out, rec) < 0) rc = -1;
        Py_XDECREF(rec);
    }
    if (w) index_close(&x);
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
    int rc = index_open(&x, args[0], NEED_LRU | NEED_TICKET | NEED_MAP, fn);
    Py_ssize_t m = PyTuple_GET_SIZE(recs);
    if (rc == 0) rc = check_u64_range(first, m, fn);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) {
        PyObject *r = PyTuple_GET_ITEM(recs, i);
        rc = -1;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
            PyErr_Format(PyExc_TypeError, "%s(): recs[%zd] is a (key, slot, seq, csum) tuple", fn, i);
            break;
        }
        if (check_key(PyTuple_GET_ITEM(r, 0), fn) < 0 || slot_of(&x, PyTuple_GET_ITEM(r, 1), fn) < 0) break;
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
            PyObject *h = PyLong_FromLong(x.head), *t = PyLong_FromLong(x.tail), *old = NULL;
            if (h && t && PyObject_SetAttr(x.obj, attr_str[A_HEAD], h) == 0 && PyObject_SetAttr(x.obj, attr_str[A_TAIL], t) == 0) {
                x.moved = 0; /* the object has the ends now: put's, not ours, if it fails */
                old = PyObject_CallMethod(x.obj, "put", "OO", key, so);
            }
            Py_XDECREF(h);
            Py_XDECREF(t);
            if (old == NULL || (x.head = long_attr(&x, A_HEAD)) < -1 || (x.tail = long_attr(&x, A_TAIL)) < -1 ||
                x.head >= x.nslots || x.tail >= x.nslots || PyList_GET_SIZE(x.slot_key) != x.nslots) {
                if (old != NULL && !PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "%s(): the index's LRU ends or slot_key are out of range", fn);
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
        link_tail(&x, s);
    }
    index_close(&x);
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
    int rc = index_open(&x, args[0], NEED_LRU | NEED_SEQ | NEED_CSUM | NEED_MAP | NEED_PINS, fn);
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
        long s = slot_of(&x, so, fn);
        if (s < 0) {
            rc = -1;
            break;
        }
        if (x.tail != s) { /* SlotIndex.touch_slot */
            if (unlink_slot(&x, s) < 0) {
                rc = -1;
                break;
            }
            link_tail(&x, s);
        }
        PyObject *had = PyDict_GetItemWithError(x.pins, so);
        long n = had == NULL ? 0 : PyLong_AsLong(had);
        if ((had == NULL && PyErr_Occurred()) || (n == -1 && PyErr_Occurred())) {
            rc = -1;
            break;
        }
        PyObject *cnt = PyLong_FromLong(n + 1);
        if (cnt == NULL || PyDict_SetItem(x.pins, so, cnt) < 0 || !(pos = PyLong_FromSsize_t(i)) ||
            !(v = Py_BuildValue("(OKK)", so, (unsigned long long)x.seq[s], (unsigned long long)x.csum[s])) ||
            PyDict_SetItem(found, pos, v) < 0)
            rc = -1;
        Py_XDECREF(cnt);
        Py_XDECREF(pos);
        Py_XDECREF(v);
    }
    index_close(&x);
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
    int rc = index_open(&x, args[0], NEED_RELEASE, fn);
    Py_ssize_t m = PySequence_Fast_GET_SIZE(slots);
    for (Py_ssize_t i = 0; rc == 0 && i < m; i++) { /* each pinned (one pinned fewer times than it comes fails on the way) */
        PyObject *so = PySequence_Fast_GET_ITEM(slots, i);
        if (slot_of(&x, so, fn) < 0) rc = -1;
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
            rc = get_u64(t, &u) < 0 || PyDict_DelItem(x.zombies, so) < 0 ? -1 : release(&x, PyLong_AsLong(so), u);
            Py_DECREF(t);
        }
    }
    index_close(&x);
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
