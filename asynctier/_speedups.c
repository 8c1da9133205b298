/* Accelerators for per-chunk work on the event loop's thread, each with a Python twin that
 * is the reference and the fallback (asynctier.integrity._b32): built when a C compiler is
 * there, and the same results either way (tests/test_integrity_and_torch.py compares them).
 *
 * b32(key): a key's file-name token, RFC 4648 base32, lowercase, without padding. The fs
 * tier computes one per store, two per store that recycles a victim's file, one per load:
 * about 1 us each in Python on this project's machines, 0.1 us here.
 *
 * The fs tier's per-chunk plan on the native engine (tiers/fs/fast.py) also needs, per store,
 * the shard and name of the key and of its victim and the chunk's header in the job slot's
 * header block: name_of and pack_header_into, twins of asynctier.tiers.fs.layout.shard_of +
 * key_token and of asynctier.integrity.pack_header.
 *
 * A group of fs loads or stores is planned and checked in bulk: _speedups_groups.c.
 *
 * The nvme tier's native paths check each header a read brought (header_matches, also the
 * fs tier's loads) and pack the journal's records (pack_records): twins of
 * asynctier.integrity.header_matches and of asynctier.tiers.nvme.format._pack_records
 * (tests/test_c_twins.py compares them); a store job's steps are in _speedups_nvme.c.
 *
 * All but b32 hash with xxh3: the system xxHash's XXH3_64bits, the one the native workers
 * use, whose address the caller gives (use_xxh3, once: asynctier.engines.speedups.speedups()
 * finds and checks it, and gives this module only then). */
#include "_speedups.h"

static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz234567";

/* The base32 of s[0:n] written at d (8n/5 characters, rounded up); the end. */
SP_HIDDEN char *b32_into(const unsigned char *s, Py_ssize_t n, char *d) {
    /* the low bits of acc hold the bits not written yet (the older ones shift out unread) */
    uint32_t acc = 0;
    int bits = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        acc = (acc << 8) | s[i];
        bits += 8;
        while (bits >= 5) {
            bits -= 5;
            *d++ = ALPHABET[(acc >> bits) & 31];
        }
    }
    if (bits > 0) *d++ = ALPHABET[(acc << (5 - bits)) & 31];
    return d;
}

static PyObject *b32(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "b32() takes bytes, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > PY_SSIZE_T_MAX / 8) return PyErr_NoMemory();
    PyObject *out = PyUnicode_New((8 * n + 4) / 5, 127);
    if (out == NULL) return NULL;
    b32_into((const unsigned char *)PyBytes_AS_STRING(arg), n, (char *)PyUnicode_1BYTE_DATA(out));
    return out;
}

SP_HIDDEN xxh3_fn xxh3 = NULL;

static PyObject *use_xxh3(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "use_xxh3() takes the function's address as an int, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "use_xxh3() needs a non-null address");
        return NULL;
    }
    xxh3 = (xxh3_fn)p;
    Py_RETURN_NONE;
}

SP_HIDDEN int need_xxh3(const char *fn) {
    if (xxh3 != NULL) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s() hashes with XXH3_64bits: call use_xxh3() first", fn);
    return -1;
}


/* name_of(key) -> (shard, token): the shard directory of key's file and its name, ASCII
 * bytes (as the native job descriptors take it); keys of at most 96 bytes (longer ones are
 * named by a BLAKE2b hash: the caller's Python twin names those). */
static PyObject *name_of(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "name_of() takes bytes, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > MAX_B32_KEY) {
        PyErr_Format(PyExc_ValueError, "name_of() names keys of at most %d bytes, not %zd", MAX_B32_KEY, n);
        return NULL;
    }
    if (need_xxh3("name_of") < 0) return NULL;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(arg);
    char tok[(8 * MAX_B32_KEY + 4) / 5];
    char *d = b32_into(s, n, tok);
    long shard = (long)(xxh3(s, (size_t)n) & (N_SHARDS - 1));
    PyObject *token = PyBytes_FromStringAndSize(tok, d - tok);
    if (token == NULL) return NULL;
    PyObject *out = PyTuple_New(2);
    PyObject *sh = PyLong_FromLong(shard);
    if (out == NULL || sh == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(sh);
        Py_DECREF(token);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, sh);
    PyTuple_SET_ITEM(out, 1, token);
    return out;
}


static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The header asynctier.integrity.pack_header(key, payload_len, csum, layout_digest, seq) at p
 * (FIXED_LEN + klen + 8 bytes); its size. */
SP_HIDDEN Py_ssize_t put_header(unsigned char *p, const char *key, Py_ssize_t klen, uint64_t payload_len, uint64_t csum,
                             uint64_t seq, const char *digest) {
    memcpy(p, HEADER_MAGIC, 4);
    put_le(p + 4, FORMAT_VERSION, 2);
    put_le(p + 6, 0, 2); /* flags */
    put_le(p + 8, (uint64_t)klen, 4);
    put_le(p + 12, payload_len, 8);
    put_le(p + 20, csum, 8);
    put_le(p + 28, seq, 8);
    memcpy(p + 36, digest, DIGEST_LEN);
    memcpy(p + FIXED_LEN, key, (size_t)klen);
    put_le(p + FIXED_LEN + klen, xxh3(p, (size_t)(FIXED_LEN + klen)), 8);
    return FIXED_LEN + klen + 8;
}

/* A key argument: bytes of at most 2**32 - 1 bytes (the header's key length field). */
SP_HIDDEN int check_key(PyObject *key, const char *fn) {
    if (!PyBytes_CheckExact(key)) { /* (a subclass's __hash__ or __eq__ would run in lookups) */
        PyErr_Format(PyExc_TypeError, "%s(): a key is bytes, not %.100s", fn, Py_TYPE(key)->tp_name);
        return -1;
    }
    if ((uint64_t)PyBytes_GET_SIZE(key) > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s(): a key of %zd bytes (at most 2**32 - 1)", fn, PyBytes_GET_SIZE(key));
        return -1;
    }
    return 0;
}

SP_HIDDEN int check_digest(PyObject *digest, const char *fn) {
    if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != DIGEST_LEN) {
        PyErr_Format(PyExc_ValueError, "%s(): layout_digest is %d bytes", fn, DIGEST_LEN);
        return -1;
    }
    return 0;
}

/* 0 if a METH_FASTCALL function fn got the want arguments it takes, else -1 with TypeError. */
SP_HIDDEN int check_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", fn, want, nargs);
    return -1;
}

/* An unsigned 64-bit field from a Python int (OverflowError outside 0 .. 2**64 - 1). */
/* The twins take exact ints and bytes only: converting anything else (numpy's ints, an
 * int-like's __index__, a subclass's __hash__ or __eq__ in a dict lookup) would run Python
 * code between a twin's checks and its writes, which could change what it checked. */
SP_HIDDEN int need_int(PyObject *v) {
    if (PyLong_CheckExact(v)) return 0;
    PyErr_Format(PyExc_TypeError, "an int is expected, not %.100s", Py_TYPE(v)->tp_name);
    return -1;
}

SP_HIDDEN int get_u64(PyObject *v, uint64_t *out) {
    if (need_int(v) < 0) return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)x;
    return 0;
}

SP_HIDDEN int get_ll(PyObject *v, long long *out) {
    if (need_int(v) < 0) return -1;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

/* pack_header_into(block, used, key, payload_len, layout_digest) -> size: the header
 * asynctier.integrity.pack_header(key, payload_len, 0, layout_digest) written at
 * the start of block, and the rest of the first `used` bytes zeroed (what an older, longer
 * header left: the block is written to the file whole). The header's size. */
static PyObject *pack_header_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs("pack_header_into", nargs, 5) < 0) return NULL;
    Py_ssize_t used = PyLong_AsSsize_t(args[1]);
    if (used == -1 && PyErr_Occurred()) return NULL;
    PyObject *key = args[2], *digest = args[4];
    uint64_t payload_len;
    if (check_key(key, "pack_header_into") < 0 || check_digest(digest, "pack_header_into") < 0 ||
        get_u64(args[3], &payload_len) < 0 || need_xxh3("pack_header_into") < 0)
        return NULL;
    Py_ssize_t klen = PyBytes_GET_SIZE(key);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t size = FIXED_LEN + klen + 8;
    if (size > view.len || used > view.len) {
        PyErr_Format(PyExc_ValueError, "pack_header_into(): a %zd-byte header (%zd used) in a %zd-byte block",
                     size, used, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *p = (unsigned char *)view.buf;
    put_header(p, PyBytes_AS_STRING(key), klen, payload_len, 0, 0, PyBytes_AS_STRING(digest));
    if (used > size) memset(p + size, 0, (size_t)(used - size));
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(size);
}

/* header_matches(buf, key, payload_len, csum, layout_digest, seq) -> bool: whether buf
 * starts with pack_header(key, payload_len, csum, layout_digest, seq) (its twin:
 * asynctier.integrity.header_matches, the loads' fast accept). */
static PyObject *header_matches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "header_matches";
    if (check_nargs(fn, nargs, 6) < 0) return NULL;
    uint64_t payload_len, csum, seq;
    PyObject *key = args[1];
    if (check_key(key, fn) < 0 || get_u64(args[2], &payload_len) < 0 || get_u64(args[3], &csum) < 0 ||
        check_digest(args[4], fn) < 0 || get_u64(args[5], &seq) < 0 || need_xxh3(fn) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t klen = PyBytes_GET_SIZE(key), size = FIXED_LEN + klen + 8;
    int same = 0;
    if (view.len >= size) {
        unsigned char stack[512], *want = size <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)size);
        if (want == NULL) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        put_header(want, PyBytes_AS_STRING(key), klen, payload_len, csum, seq, PyBytes_AS_STRING(args[4]));
        same = memcmp(view.buf, want, (size_t)size) == 0;
        if (want != stack) PyMem_Free(want);
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(same);
}

#define RECORD_LEN 24 /* asynctier.tiers.nvme.format.RECORD: <BBHIQQ */

/* pack_records(typ, items) -> list[bytes]: the nvme journal's records of type typ, one per
 * (key, slot, seq, csum) in items, each with its trailing xxh3 (its twin:
 * asynctier.tiers.nvme.format.pack_records). */
static PyObject *pack_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char fn[] = "pack_records";
    if (check_nargs(fn, nargs, 2) < 0) return NULL;
    long typ = PyLong_AsLong(args[0]);
    if (typ == -1 && PyErr_Occurred()) return NULL;
    if (typ < 0 || typ > 255) {
        PyErr_Format(PyExc_ValueError, "%s(): a record type is 0 to 255, not %ld", fn, typ);
        return NULL;
    }
    if (need_xxh3(fn) < 0) return NULL;
    PyObject *items = PySequence_Fast(args[1], "pack_records(): items is a sequence of (key, slot, seq, csum)");
    if (items == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject *out = PyList_New(n);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_Format(PyExc_TypeError, "%s(): each item is a (key, slot, seq, csum) tuple", fn);
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0);
        uint64_t slot, seq, csum;
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "%s(): a key is bytes, not %.100s", fn, Py_TYPE(key)->tp_name);
            goto fail;
        }
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        if (get_u64(PyTuple_GET_ITEM(item, 1), &slot) < 0 || get_u64(PyTuple_GET_ITEM(item, 2), &seq) < 0 ||
            get_u64(PyTuple_GET_ITEM(item, 3), &csum) < 0)
            goto fail;
        if (klen > UINT16_MAX || slot > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s(): a key of %zd bytes (at most 65535) or slot %llu (at most 2**32 - 1)",
                         fn, klen, (unsigned long long)slot);
            goto fail;
        }
        PyObject *rec = PyBytes_FromStringAndSize(NULL, RECORD_LEN + klen + 8);
        if (rec == NULL) goto fail;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(rec);
        p[0] = (unsigned char)typ;
        p[1] = 0;
        put_le(p + 2, (uint64_t)klen, 2);
        put_le(p + 4, slot, 4);
        put_le(p + 8, seq, 8);
        put_le(p + 16, csum, 8);
        memcpy(p + RECORD_LEN, PyBytes_AS_STRING(key), (size_t)klen);
        put_le(p + RECORD_LEN + klen, xxh3(p, (size_t)(RECORD_LEN + klen)), 8);
        PyList_SET_ITEM(out, i, rec);
    }
    Py_DECREF(items);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(items);
    return NULL;
}

/* An int argument within int32 (the descriptors' fields). */
SP_HIDDEN int addr_at(uint64_t base, uint64_t i, uint64_t stride, uint64_t *out, const char *fn) {
    if (!__builtin_mul_overflow(i, stride, out) && !__builtin_add_overflow(base, *out, out)) return 0;
    PyErr_Format(PyExc_OverflowError, "%s(): an address past 2**64 - 1", fn);
    return -1;
}

SP_HIDDEN PyObject *tuple_of(int n, PyObject **items) {
    PyObject *t = NULL;
    for (int i = 0; i < n; i++)
        if (items[i] == NULL) goto fail;
    if ((t = PyTuple_New(n)) == NULL) goto fail;
    for (int i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
    return NULL;
}

SP_HIDDEN PyObject *own_tuple(PyObject *seq, const char *msg) {
    PyObject *fast = PySequence_Fast(seq, msg);
    if (fast == NULL || PyTuple_CheckExact(fast)) return fast;
    PyObject *t = PyList_AsTuple(fast);
    Py_DECREF(fast);
    return t;
}

SP_HIDDEN int get_i32(PyObject *v, int32_t *out, const char *fn, const char *what) {
    if (need_int(v) < 0) return -1;
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s(): %s is a 32-bit int, not %ld", fn, what, x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* The base32 token of a key named by name_of (1 to MAX_B32_KEY bytes), else -1 with an error. */
SP_HIDDEN int check_named_key(PyObject *key, const char *fn) {
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "%s(): a key is bytes, not %.100s", fn, Py_TYPE(key)->tp_name);
        return -1;
    }
    if (PyBytes_GET_SIZE(key) < 1 || PyBytes_GET_SIZE(key) > MAX_B32_KEY) {
        PyErr_Format(PyExc_ValueError, "%s(): names keys of 1 to %d bytes, not %zd", fn, MAX_B32_KEY,
                     PyBytes_GET_SIZE(key));
        return -1;
    }
    return 0;
}

/* plain_keys(keys, max_len) -> bool: every item of the list keys is a bytes (exactly) of 1 to
 * max_len bytes (asynctier.core.validation.plain_keys, the reference). */
static PyObject *plain_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs("plain_keys", nargs, 2) < 0) return NULL;
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(args[0])) {
        PyErr_Format(PyExc_TypeError, "plain_keys(): keys is a list, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        PyObject *k = PyList_GET_ITEM(args[0], i);
        if (!PyBytes_CheckExact(k) || PyBytes_GET_SIZE(k) < 1 || PyBytes_GET_SIZE(k) > most) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* plain_ids(ids, n) -> bool: the list ids is not empty and each item is an int (exactly) in
 * [0, n) (asynctier.core.validation.plain_ids, the reference). */
static PyObject *plain_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs("plain_ids", nargs, 2) < 0) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(args[0])) {
        PyErr_Format(PyExc_TypeError, "plain_ids(): ids is a list, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(args[0]);
    if (m == 0) Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *c = PyList_GET_ITEM(args[0], i);
        if (!PyLong_CheckExact(c)) Py_RETURN_FALSE;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(c, &overflow);
        if (overflow || v < 0 || v >= n) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* untrack(index) -> None: see asynctier/untracked.py. A list, or a dict (an OrderedDict too),
 * whose items (keys and values) are of types without the collector's support (bytes, int,
 * LRUEntry) can be in no reference cycle: the cycle collector need not traverse it. CPython
 * stops tracking such dicts by itself, never lists or OrderedDicts; a dict it tracks again
 * once anything it might have to follow goes in. */
static int atomic(PyObject *o, PyObject *where, Py_ssize_t i) {
    if (!PyObject_IS_GC(o)) return 0;
    PyErr_Format(PyExc_TypeError, "untrack(): a %.50s holds a %.50s at %zd; only objects that reference nothing "
                 "the collector follows (bytes, int) may be left out", Py_TYPE(where)->tp_name, Py_TYPE(o)->tp_name, i);
    return -1;
}

static PyObject *untrack(PyObject *self, PyObject *index) {
    (void)self;
    if (PyList_CheckExact(index)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(index); i++)
            if (atomic(PyList_GET_ITEM(index, i), index, i) < 0) return NULL;
    } else if (PyDict_Check(index)) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        for (; PyDict_Next(index, &pos, &k, &v); i++)
            if (atomic(k, index, i) < 0 || atomic(v, index, i) < 0) return NULL;
    } else {
        PyErr_Format(PyExc_TypeError, "untrack(): a list or a dict, not %.50s", Py_TYPE(index)->tp_name);
        return NULL;
    }
    if (PyObject_GC_IsTracked(index)) PyObject_GC_UnTrack(index);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"plain_keys", (PyCFunction)(void (*)(void))plain_keys, METH_FASTCALL,
     "plain_keys(keys, max_len) -> bool: each key is bytes of 1 to max_len bytes."},
    {"plain_ids", (PyCFunction)(void (*)(void))plain_ids, METH_FASTCALL,
     "plain_ids(ids, n) -> bool: ids is not empty and each is an int in [0, n)."},
    {"b32", b32, METH_O, "b32(key: bytes) -> str: RFC 4648 base32 of key, lowercase, without padding."},
    {"use_xxh3", use_xxh3, METH_O, "use_xxh3(address: int) -> None: hash with the XXH3_64bits there."},
    {"name_of", name_of, METH_O, "name_of(key: bytes) -> (shard, token): the fs tier's shard and file name."},
    {"untrack", untrack, METH_O,
     "untrack(index) -> None: a list or dict of bytes, ints and the like left out of the cycle collector."},
    {"pack_header_into", (PyCFunction)(void (*)(void))pack_header_into, METH_FASTCALL,
     "pack_header_into(block, used, key, payload_len, layout_digest) -> size: a header with a zero checksum."},
    {"header_matches", (PyCFunction)(void (*)(void))header_matches, METH_FASTCALL,
     "header_matches(buf, key, payload_len, csum, layout_digest, seq) -> bool: buf starts with that header."},
    {"pack_reads", (PyCFunction)(void (*)(void))pack_reads, METH_FASTCALL,
     "pack_reads(table, offset, prio, keys, cids, blocks, dfds, flags, hashed, hb_addr, hb_len, view_addr, n) -> None:"
     " a group of fs loads' READ descriptors."},
    {"reads_failed", (PyCFunction)(void (*)(void))reads_failed, METH_FASTCALL,
     "reads_failed(res, offset, keys, blocks, hbs, hb_len, n, layout_digest) -> list[int]: the reads not simply done."},
    {"pack_writes", (PyCFunction)(void (*)(void))pack_writes, METH_FASTCALL,
     "pack_writes(table, offset, prio, keys, cids, blocks, fds, dfds, flags, sync, mode, hbs, hb_addr, hb_len,"
     " view_addr, n, layout_digest) -> None: a group of fs stores into new files."},
    {"pack_recycles", (PyCFunction)(void (*)(void))pack_recycles, METH_FASTCALL,
     "pack_recycles(table, offset, prio, keys, victims, temps, cids, blocks, dfds, flags, lock_fd, sync, hbs, hb_addr,"
     " hb_len, view_addr, n, layout_digest) -> None: a group of fs stores into victims' files."},
    {"jobs_failed", (PyCFunction)(void (*)(void))jobs_failed, METH_FASTCALL,
     "jobs_failed(res, offset, m) -> list[int]: the jobs that did not simply succeed."},
    {"split_plain", (PyCFunction)(void (*)(void))split_plain, METH_FASTCALL,
     "split_plain(keys, cids, reserved, tmpfile, recycle) -> (rec, new, others, rkeys, rvictims, rcids, nkeys, ncids):"
     " a group of fs stores sorted by what their reservations leave to do."},
    {"pack_records", (PyCFunction)(void (*)(void))pack_records, METH_FASTCALL,
     "pack_records(typ, items) -> list[bytes]: nvme journal records of (key, slot, seq, csum)."},
    {"evict_oldest", (PyCFunction)(void (*)(void))evict_oldest, METH_FASTCALL,
     "evict_oldest(index, n, more) -> list[(key, slot, seq, 0)]: the nvme index's LRU victims dropped."},
    {"release_many", (PyCFunction)(void (*)(void))release_many, METH_FASTCALL,
     "release_many(index, slots, first_ticket) -> None: the nvme index's slots freed behind their tickets."},
    {"take_free", (PyCFunction)(void (*)(void))take_free, METH_FASTCALL,
     "take_free(index, n, pick_max) -> list[int]: n of the nvme index's free slots, in as few runs as it has."},
    {"pack_keys", (PyCFunction)(void (*)(void))pack_keys, METH_FASTCALL,
     "pack_keys(keys, start, stop) -> (bytes, bytes): keys[start:stop] as an nvme checkpoint stores them."},
    {"begin_writes", (PyCFunction)(void (*)(void))begin_writes, METH_FASTCALL,
     "begin_writes(index, keys, taken, first_seq) -> int: the nvme index's writes numbered; the ticket to flush."},
    {"end_writes", (PyCFunction)(void (*)(void))end_writes, METH_FASTCALL,
     "end_writes(index, keys, written, slots, csums) -> list[(key, slot, seq, csum)]: the nvme index's writes ended."},
    {"put_published", (PyCFunction)(void (*)(void))put_published, METH_FASTCALL,
     "put_published(index, recs, first_ticket) -> list[(position, slot)]: the nvme index's keys mapped."},
    {"pack_slot_writes", (PyCFunction)(void (*)(void))pack_slot_writes, METH_FASTCALL,
     "pack_slot_writes(table, offset, prio, runs, keys, cids, slots, fds, hbs, hb_addr, hb_len, iovs, iov_addr,"
     " sums_addr, view_addr, n, layout_digest) -> None: an nvme store job's WRITEV descriptors, headers, iovecs."},
    {"pack_slot_reads", (PyCFunction)(void (*)(void))pack_slot_reads, METH_FASTCALL,
     "pack_slot_reads(table, offset, prio, runs, cids, fds, hb_addr, hb_len, iovs, iov_addr, sums_addr, view_addr, n,"
     " hashed) -> None: an nvme load job's READV descriptors and iovecs."},
    {"runs_loaded", (PyCFunction)(void (*)(void))runs_loaded, METH_FASTCALL,
     "runs_loaded(res, offset, runs, keys, found, hbs, hb_len, sums, n, layout_digest, verify, bad, unpins) -> int:"
     " an nvme load job's chunks checked: how many loaded; the others' positions into bad."},
    {"pin_many", (PyCFunction)(void (*)(void))pin_many, METH_FASTCALL,
     "pin_many(index, keys) -> (found, missing): the nvme index's slots of a load job pinned."},
    {"unpin_many", (PyCFunction)(void (*)(void))unpin_many, METH_FASTCALL,
     "unpin_many(index, slots) -> None: the nvme index's slots unpinned (freed if freed meanwhile)."},
    {"slot_runs", (PyCFunction)(void (*)(void))slot_runs, METH_FASTCALL,
     "slot_runs(slots, nstripes, data_off, slot_size, limit) -> list[list[(position, slot, stripe, offset)]]:"
     " an nvme job's slots in runs adjacent on one stripe."},
    {"runs_written", (PyCFunction)(void (*)(void))runs_written, METH_FASTCALL,
     "runs_written(res, offset, runs, sums, csums, written) -> list[int]: an nvme store job's runs not written."},
    {"lru_reserve_plain", (PyCFunction)(void (*)(void))lru_reserve_plain, METH_FASTCALL,
     "lru_reserve_plain(index, entry_type, keys, start, nbytes, out) -> int: an LRU index's plain reservations."},
    {"lru_commit_all", (PyCFunction)(void (*)(void))lru_commit_all, METH_FASTCALL,
     "lru_commit_all(index, keys) -> None: an LRU index's writes of keys committed."},
    {"lru_pin_all", (PyCFunction)(void (*)(void))lru_pin_all, METH_FASTCALL,
     "lru_pin_all(index, keys) -> list[entry | None]: an LRU index's committed entries of keys pinned."},
    {"lru_unpin_all", (PyCFunction)(void (*)(void))lru_unpin_all, METH_FASTCALL,
     "lru_unpin_all(index, entry_type, keys, entries) -> None: an LRU index's pins of lru_pin_all ended."},
    {"lru_removed_all", (PyCFunction)(void (*)(void))lru_removed_all, METH_FASTCALL,
     "lru_removed_all(index, keys) -> None: an LRU index's removals of keys over (their waiters woken)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "C twins of asynctier's per-chunk Python helpers.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && lru_add_types(m) < 0) Py_CLEAR(m);
    return m;
}
