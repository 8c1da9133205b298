/* asynctier._speedups, the LRU index's side (asynctier/lru.py): a group of stores reserves
 * room for its keys and commits them in one call each instead of a few Python steps per key.
 * Each function has its Python twin, the reference and the fallback, in asynctier/lru.py
 * (tests/test_c_twins_lru.py compares the two from random states).
 *
 * The index is an LRUIndex: its attributes are read here by name and checked for their
 * types; its counts are written back at the end. Only the plain case is done here; the
 * caller does the rest one key at a time, as before.
 *
 * LRUEntry is the index's entry (the twin of asynctier.lru._PyEntry, the same four
 * attributes): made here without a Python __init__, and read here without an attribute
 * lookup; the functions take entries of either type. */
#include "_speedups.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t nbytes, writers, pins;
    char committed;
} Entry;

static PyTypeObject EntryType;

#define IS_ENTRY(e) Py_IS_TYPE((e), &EntryType)
#define AS_ENTRY(e) ((Entry *)(e))

static Entry *entry_make(Py_ssize_t nbytes, int committed, Py_ssize_t writers) {
    Entry *e = PyObject_New(Entry, &EntryType);
    if (e != NULL) {
        e->nbytes = nbytes;
        e->writers = writers;
        e->pins = 0;
        e->committed = (char)committed;
    }
    return e;
}

/* LRUEntry(nbytes, committed, writers=0), as _PyEntry's __init__ takes them. */
static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"nbytes", "committed", "writers", NULL};
    Py_ssize_t nbytes, writers = 0;
    int committed;
    (void)type;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "np|n:LRUEntry", kw, &nbytes, &committed, &writers)) return NULL;
    return (PyObject *)entry_make(nbytes, committed, writers);
}

static PyObject *entry_repr(PyObject *self) {
    Entry *e = AS_ENTRY(self);
    return PyUnicode_FromFormat("LRUEntry(nbytes=%zd, committed=%s, writers=%zd, pins=%zd)", e->nbytes,
                                e->committed ? "True" : "False", e->writers, e->pins);
}

static PyMemberDef entry_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(Entry, nbytes), 0, "bytes counted against the capacity"},
    {"committed", T_BOOL, offsetof(Entry, committed), 0, "visible to lookups (else reserved by a write)"},
    {"writers", T_PYSSIZET, offsetof(Entry, writers), 0, "writes of the key in progress"},
    {"pins", T_PYSSIZET, offsetof(Entry, pins), 0, "readers holding it"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asynctier._speedups.LRUEntry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An LRU index's entry (asynctier.lru._PyEntry's twin).",
    .tp_new = entry_new,
    .tp_repr = entry_repr,
    .tp_members = entry_members,
};

SP_HIDDEN int lru_add_types(PyObject *module) {
    if (PyType_Ready(&EntryType) < 0) return -1;
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(module, "LRUEntry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        return -1;
    }
    return 0;
}

static PyObject *s_entries, *s_removing, *s_used, *s_committed, *s_flag, *s_capacity, *s_track, *s_pins, *s_writers,
    *s_nbytes, *s_move_to_end, *s_set;

static int intern_names(void) {
    if (s_set) return 0; /* the last one: all are set */
#define NAME(var, text) /* (each once: a call after one failed goes on where it stopped) */ \
    if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return -1;
    NAME(s_entries, "_entries")
    NAME(s_removing, "_removing")
    NAME(s_used, "_used")
    NAME(s_committed, "_committed")
    NAME(s_flag, "committed")
    NAME(s_capacity, "capacity_bytes")
    NAME(s_track, "track_removals")
    NAME(s_pins, "pins")
    NAME(s_writers, "writers")
    NAME(s_nbytes, "nbytes")
    NAME(s_move_to_end, "move_to_end")
    NAME(s_set, "set")
#undef NAME
    return 0;
}

/* An int attribute of obj (an exact int) into *out; -1 with an error. */
static int long_attr(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int rc = get_ll(v, out);
    Py_DECREF(v);
    return rc;
}

static int set_long_attr(PyObject *obj, PyObject *name, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    int rc = o ? PyObject_SetAttr(obj, name, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* A count written back, an error pending or not: the write may run Python code (a
 * __setattr__), which must not see a pending error. That error stays (the write's own is
 * dropped then); else -1 if the write failed. */
static int write_back(PyObject *index, PyObject *name, long long v) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int rc = set_long_attr(index, name, v);
    if (type == NULL) return rc;
    if (rc < 0) PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return 0;
}

/* 0 if every item of keys (from PySequence_Fast) is exact bytes (a subclass's __hash__ or
 * __eq__ would run in the lookups), else -1 with TypeError naming fn. */
static int check_keys(PyObject *keys, const char *fn) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keys); i++)
        if (check_key(PySequence_Fast_GET_ITEM(keys, i), fn) < 0) return -1;
    return 0;
}

/* keys[i] of the caller's sequence (from PySequence_Fast), which the reference iterates as
 * it changes: checked again (it may have changed since check_keys) and held, as Python code
 * that runs before its last use may drop the sequence's reference; NULL with an error. */
static PyObject *key_at(PyObject *keys, Py_ssize_t i, const char *fn) {
    PyObject *key = PySequence_Fast_GET_ITEM(keys, i);
    if (check_key(key, fn) < 0) return NULL;
    Py_INCREF(key);
    return key;
}

/* 1 if entry e may be evicted (committed, not pinned, not being written), 0 if not, -1. */
static int evictable(PyObject *e, long long *nbytes) {
    if (IS_ENTRY(e)) {
        Entry *x = AS_ENTRY(e);
        *nbytes = x->nbytes;
        return x->committed && x->pins == 0 && x->writers == 0;
    }
    Py_INCREF(e); /* (its getters may drop the index's reference) */
    PyObject *c = PyObject_GetAttr(e, s_flag);
    int committed = c ? PyObject_IsTrue(c) : -1;
    Py_XDECREF(c);
    long long pins, writers;
    int rc = -1;
    if (committed >= 0 && long_attr(e, s_pins, &pins) == 0 && long_attr(e, s_writers, &writers) == 0 &&
        long_attr(e, s_nbytes, nbytes) == 0)
        rc = committed && pins == 0 && writers == 0;
    Py_DECREF(e);
    return rc;
}

/* lru_reserve_plain(index, entry_type, keys, start, nbytes, out) -> int: see
 * asynctier.lru.reserve_plain. */
SP_HIDDEN PyObject *lru_reserve_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "lru_reserve_plain";
    if (check_nargs(fn, nargs, 6) < 0 || intern_names() < 0) return NULL;
    PyObject *index = args[0], *etype = args[1], *out = args[5];
    long long start, nbytes;
    if (get_ll(args[3], &start) < 0 || get_ll(args[4], &nbytes) < 0) return NULL;
    if (!PyList_Check(out) || start < 0 || nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "%s(): out is a list, start and nbytes >= 0", fn);
        return NULL;
    }
    PyObject *keys = own_tuple(args[2], "lru_reserve_plain(): keys is a sequence");
    if (keys == NULL) return NULL;
    PyObject *entries = PyObject_GetAttr(index, s_entries), *removing = PyObject_GetAttr(index, s_removing);
    PyObject *capo = PyObject_GetAttr(index, s_capacity), *tracko = PyObject_GetAttr(index, s_track);
    PyObject *victims = NULL, *it = NULL, *result = NULL;
    long long used = 0, committed = 0, cap = -1;
    int track = 0, have_counts = 0;
    Py_ssize_t done = 0, m = PyTuple_GET_SIZE(keys);
    if (!entries || !removing || !capo || !tracko) goto out;
    if (!PyDict_Check(entries) || !PyDict_CheckExact(removing)) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's _entries and _removing are dicts", fn);
        goto out;
    }
    if ((track = PyObject_IsTrue(tracko)) < 0 || (capo != Py_None && get_ll(capo, &cap) < 0)) goto out;
    if (long_attr(index, s_used, &used) < 0 || long_attr(index, s_committed, &committed) < 0) goto out;
    have_counts = 1;
    for (Py_ssize_t i = (Py_ssize_t)start; i < m; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        long long after, left, left_committed; /* _used with this key's room; _used, _committed less its victims */
        int r;
        if (!PyBytes_CheckExact(key)) break;
        if ((r = PyDict_Contains(removing, key)) != 0 || (r = PyDict_Contains(entries, key)) != 0) {
            if (r < 0) goto out;
            break; /* being removed, or has an entry: the caller's */
        }
        if (__builtin_add_overflow(used, nbytes, &after)) break; /* past a long long: the caller's */
        if ((victims = PyList_New(0)) == NULL) goto out;
        if (capo != Py_None && after > cap) {
            if (nbytes > cap) break; /* CapacityError: the caller's */
            long long need = after - cap, freed = 0, eb;
            int plain = 1;
            if ((it = PyObject_GetIter(entries)) == NULL) goto out;
            while (need > 0) { /* the oldest entries, each evictable, until there is room */
                PyObject *k = PyIter_Next(it);
                if (k == NULL) {
                    if (PyErr_Occurred()) goto out;
                    plain = 0; /* too few: the caller's (CapacityError) */
                    break;
                }
                PyObject *e = PyDict_GetItemWithError(entries, k);
                int ok = e == NULL ? -1 : evictable(e, &eb);
                if (ok > 0 && (__builtin_sub_overflow(need, eb, &need) || __builtin_add_overflow(freed, eb, &freed)))
                    ok = 0; /* sizes past a long long: the caller's */
                if (ok <= 0 || PyList_Append(victims, k) < 0) {
                    Py_DECREF(k);
                    if (ok < 0 || PyErr_Occurred()) {
                        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "lru_reserve_plain(): index changed");
                        goto out;
                    }
                    plain = 0; /* one to pass over: the caller's */
                    break;
                }
                Py_DECREF(k);
            }
            Py_CLEAR(it);
            Py_ssize_t nv = PyList_GET_SIZE(victims);
            if (!plain || __builtin_sub_overflow(used, freed, &left) || __builtin_add_overflow(left, nbytes, &after) ||
                __builtin_sub_overflow(committed, (long long)nv, &left_committed))
                break; /* (counts past a long long too: the caller's) */
            for (Py_ssize_t j = 0; j < nv; j++) {
                PyObject *k = PyList_GET_ITEM(victims, j);
                if (PyObject_DelItem(entries, k) < 0 || (track && PyDict_SetDefault(removing, k, Py_None) == NULL))
                    goto out;
            }
            used = left;
            committed = left_committed;
        }
        PyObject *e = etype == (PyObject *)&EntryType ? (PyObject *)entry_make((Py_ssize_t)nbytes, 0, 1)
                                                     : PyObject_CallFunction(etype, "LOi", nbytes, Py_False, 1);
        int rc = e ? PyObject_SetItem(entries, key, e) : -1;
        Py_XDECREF(e);
        if (rc < 0) goto out;
        used = after;
        if (PyList_Append(out, victims) < 0) goto out;
        Py_CLEAR(victims);
        done++;
    }
    result = PyLong_FromSsize_t(done);
out:
    if (have_counts && (write_back(index, s_used, used) < 0 || write_back(index, s_committed, committed) < 0))
        Py_CLEAR(result);
    Py_XDECREF(victims);
    Py_XDECREF(it);
    Py_XDECREF(entries);
    Py_XDECREF(removing);
    Py_XDECREF(capo);
    Py_XDECREF(tracko);
    Py_DECREF(keys);
    return result;
}

/* _commit_locked's steps on an entry that is not an LRUEntry: a writer less, and committed
 * (counted in *committed once set); -1 with an error. */
static int commit_py_entry(PyObject *e, long long *committed) {
    long long writers;
    if (long_attr(e, s_writers, &writers) < 0 || set_long_attr(e, s_writers, writers > 1 ? writers - 1 : 0) < 0)
        return -1;
    PyObject *c = PyObject_GetAttr(e, s_flag);
    int was = c ? PyObject_IsTrue(c) : -1;
    Py_XDECREF(c);
    if (was < 0) return -1;
    if (!was) {
        if (PyObject_SetAttr(e, s_flag, Py_True) < 0) return -1;
        ++*committed;
    }
    return 0;
}

/* lru_commit_all(index, keys) -> None: see asynctier.lru.commit_all. */
SP_HIDDEN PyObject *lru_commit_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "lru_commit_all";
    if (check_nargs(fn, nargs, 2) < 0 || intern_names() < 0) return NULL;
    PyObject *index = args[0], *keys = PySequence_Fast(args[1], "lru_commit_all(): keys is a sequence");
    if (keys == NULL) return NULL;
    PyObject *entries = NULL, *result = NULL;
    long long committed = 0;
    int have_counts = 0;
    if (check_keys(keys, fn) < 0 || (entries = PyObject_GetAttr(index, s_entries)) == NULL) goto out;
    if (!PyDict_Check(entries)) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's _entries is a dict", fn);
        goto out;
    }
    if (long_attr(index, s_committed, &committed) < 0) goto out;
    have_counts = 1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keys); i++) {
        PyObject *key = key_at(keys, i, fn), *r = NULL;
        if (key == NULL) goto out;
        PyObject *e = PyDict_GetItemWithError(entries, key); /* (a read: OrderedDict keeps its order itself) */
        if (e == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred()) goto out;
            continue; /* removed while being written: nothing to publish */
        }
        Py_INCREF(e); /* (held while its getters run: they may drop the index's reference) */
        int rc = 0;
        if (IS_ENTRY(e)) {
            Entry *x = AS_ENTRY(e);
            x->writers = x->writers > 1 ? x->writers - 1 : 0;
            if (!x->committed) {
                x->committed = 1;
                committed++;
            }
        } else {
            rc = commit_py_entry(e, &committed);
        }
        Py_DECREF(e);
        if (rc == 0) r = PyObject_CallMethodOneArg(entries, s_move_to_end, key);
        Py_DECREF(key);
        if (r == NULL) goto out;
        Py_DECREF(r);
    }
    result = Py_None;
    Py_INCREF(result);
out:
    if (have_counts && write_back(index, s_committed, committed) < 0) Py_CLEAR(result);
    Py_XDECREF(entries);
    Py_DECREF(keys);
    return result;
}

/* pin_entry's steps on an entry that is not an LRUEntry: 1 if committed (and now pinned once
 * more), 0 if not, -1 with an error. */
static int pin_py_entry(PyObject *e) {
    PyObject *c = PyObject_GetAttr(e, s_flag);
    int committed = c ? PyObject_IsTrue(c) : -1;
    Py_XDECREF(c);
    long long pins;
    if (committed <= 0) return committed;
    if (long_attr(e, s_pins, &pins) < 0) return -1;
    if (pins == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "lru_pin_all(): an entry's pins past a long long");
        return -1;
    }
    return set_long_attr(e, s_pins, pins + 1) < 0 ? -1 : 1;
}

/* lru_pin_all(index, keys) -> list[entry | None]: see asynctier.lru.pin_all. */
SP_HIDDEN PyObject *lru_pin_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "lru_pin_all";
    if (check_nargs(fn, nargs, 2) < 0 || intern_names() < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[1], "lru_pin_all(): keys is a sequence");
    if (keys == NULL) return NULL;
    PyObject *entries = NULL, *out = NULL;
    if (check_keys(keys, fn) < 0 || (entries = PyObject_GetAttr(args[0], s_entries)) == NULL) goto done;
    if (!PyDict_Check(entries)) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's _entries is a dict", fn);
        goto done;
    }
    /* (filled by appends: Python code that runs meanwhile may reach it through the gc, so no empty slots) */
    if ((out = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keys); i++) {
        PyObject *key = key_at(keys, i, fn), *e = key ? PyDict_GetItemWithError(entries, key) : NULL;
        int committed = 0;
        Py_XDECREF(key); /* (not used past the lookup) */
        if (e == NULL && PyErr_Occurred()) goto fail;
        Py_XINCREF(e); /* (held while its getters run: they may drop the index's reference) */
        if (e != NULL && IS_ENTRY(e)) {
            if ((committed = AS_ENTRY(e)->committed)) AS_ENTRY(e)->pins++;
        } else if (e != NULL && (committed = pin_py_entry(e)) < 0) {
            Py_DECREF(e);
            goto fail;
        }
        int rc = PyList_Append(out, committed ? e : Py_None);
        Py_XDECREF(e);
        if (rc < 0) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(entries);
    Py_DECREF(keys);
    return out;
}

/* lru_unpin_all(index, entry_type, keys, pinned) -> None: see asynctier.lru.unpin_all. */
SP_HIDDEN PyObject *lru_unpin_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "lru_unpin_all";
    if (check_nargs(fn, nargs, 4) < 0 || intern_names() < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[2], "lru_unpin_all(): keys is a sequence");
    PyObject *pinned = keys ? PySequence_Fast(args[3], "lru_unpin_all(): entries is a sequence") : NULL;
    PyObject *entries = pinned ? PyObject_GetAttr(args[0], s_entries) : NULL, *result = NULL;
    if (entries == NULL) goto done;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(keys);
    if (!PyDict_Check(entries) || !PyType_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's _entries is a dict, entry_type a type", fn);
        goto done;
    }
    /* All checked before any change (the reference unpins those before a wrong one first). */
    if (PySequence_Fast_GET_SIZE(pinned) != m) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd keys and %zd entries", fn, m, PySequence_Fast_GET_SIZE(pinned));
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) /* (as the reference asserts) */
        if (!Py_IS_TYPE(PySequence_Fast_GET_ITEM(pinned, i), (PyTypeObject *)args[1])) {
            PyErr_Format(PyExc_TypeError, "%s(): entries[%zd] is not an entry", fn, i);
            goto done;
        }
    if (check_keys(keys, fn) < 0) goto done;
    /* Then as the reference's zip(keys, entries, strict=True), the two as they change meanwhile. */
    Py_ssize_t i;
    for (i = 0; i < PySequence_Fast_GET_SIZE(keys) && i < PySequence_Fast_GET_SIZE(pinned); i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(pinned, i), *key, *r = NULL;
        if (!Py_IS_TYPE(e, (PyTypeObject *)args[1])) {
            PyErr_Format(PyExc_TypeError, "%s(): entries[%zd] is not an entry", fn, i);
            goto done;
        }
        if ((key = key_at(keys, i, fn)) == NULL) goto done;
        Py_INCREF(e); /* (held: its getters may drop the caller's reference) */
        long long pins;
        int rc = 0;
        if (IS_ENTRY(e))
            AS_ENTRY(e)->pins = AS_ENTRY(e)->pins > 1 ? AS_ENTRY(e)->pins - 1 : 0;
        else if (long_attr(e, s_pins, &pins) < 0 || set_long_attr(e, s_pins, pins > 1 ? pins - 1 : 0) < 0)
            rc = -1;
        if (rc == 0) {
            PyObject *cur = PyDict_GetItemWithError(entries, key); /* (only compared) */
            if (cur == e) {
                r = PyObject_CallMethodOneArg(entries, s_move_to_end, key);
            } else if (cur != NULL || !PyErr_Occurred()) { /* it left the index meanwhile: only its pin goes */
                r = Py_None;
                Py_INCREF(r);
            }
        }
        Py_DECREF(e);
        Py_DECREF(key);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    if (PySequence_Fast_GET_SIZE(keys) != PySequence_Fast_GET_SIZE(pinned)) {
        PyErr_Format(PyExc_ValueError, "%s(): keys and entries of different lengths after %zd", fn, i);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(entries);
    Py_XDECREF(pinned);
    Py_XDECREF(keys);
    return result;
}

/* lru_removed_all(index, keys) -> None: see asynctier.lru.removed_all. */
SP_HIDDEN PyObject *lru_removed_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "lru_removed_all";
    if (check_nargs(fn, nargs, 2) < 0 || intern_names() < 0) return NULL;
    PyObject *keys = PySequence_Fast(args[1], "lru_removed_all(): keys is a sequence");
    if (keys == NULL) return NULL;
    PyObject *removing = NULL, *result = NULL;
    if (check_keys(keys, fn) < 0 || (removing = PyObject_GetAttr(args[0], s_removing)) == NULL) goto done;
    if (!PyDict_CheckExact(removing)) {
        PyErr_Format(PyExc_TypeError, "%s(): the index's _removing is a dict", fn);
        goto done;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keys); i++) {
        PyObject *key = key_at(keys, i, fn), *ev = key ? PyDict_GetItemWithError(removing, key) : NULL, *r;
        if (ev == NULL) {
            Py_XDECREF(key);
            if (PyErr_Occurred()) goto done;
            continue; /* not being removed */
        }
        Py_INCREF(ev);
        int rc = PyDict_DelItem(removing, key); /* (the lookup may have run a stored key's __eq__) */
        Py_DECREF(key);
        if (rc < 0) {
            Py_DECREF(ev);
            goto done;
        }
        if (ev == Py_None) {
            Py_DECREF(ev);
            continue;
        }
        r = PyObject_CallMethodNoArgs(ev, s_set); /* someone waits */
        Py_DECREF(ev);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(removing);
    Py_DECREF(keys);
    return result;
}
