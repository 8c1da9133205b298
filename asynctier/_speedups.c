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
 * key_token and of asynctier.integrity.pack_header. Both hash with xxh3: the system
 * xxHash's XXH3_64bits, the one the native workers use, whose address the caller gives
 * (use_xxh3, once: asynctier.engines.native finds and checks it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz234567";

/* The base32 of s[0:n] written at d (8n/5 characters, rounded up); the end. */
static char *b32_into(const unsigned char *s, Py_ssize_t n, char *d) {
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

typedef uint64_t (*xxh3_fn)(const void *, size_t);
static xxh3_fn xxh3 = NULL;

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

static int need_xxh3(const char *fn) {
    if (xxh3 != NULL) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s() hashes with XXH3_64bits: call use_xxh3() first", fn);
    return -1;
}

#define MAX_B32_KEY 96 /* longer keys are named by a hash (asynctier.integrity.key_token) */
#define N_SHARDS 256   /* asynctier.tiers.fs.layout.N_SHARDS */

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

#define FORMAT_VERSION 1 /* asynctier.spec.FORMAT_VERSION (the tests compare the headers) */
#define HEADER_MAGIC "ATKV"
#define FIXED_LEN 52 /* asynctier.integrity._FIXED: <4sHHIQQQ16s */
#define DIGEST_LEN 16

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* pack_header_into(block, used, key, payload_len, layout_digest) -> size: the header
 * asynctier.integrity.pack_header(key, payload_len, 0, layout_digest) written at
 * the start of block, and the rest of the first `used` bytes zeroed (what an older, longer
 * header left: the block is written to the file whole). The header's size. */
static PyObject *pack_header_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "pack_header_into() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t used = PyLong_AsSsize_t(args[1]);
    if (used == -1 && PyErr_Occurred()) return NULL;
    PyObject *key = args[2], *digest = args[4];
    if (!PyBytes_Check(key) || !PyBytes_Check(digest)) {
        PyErr_SetString(PyExc_TypeError, "pack_header_into(): key and layout_digest are bytes");
        return NULL;
    }
    if (PyBytes_GET_SIZE(digest) != DIGEST_LEN) {
        PyErr_Format(PyExc_ValueError, "pack_header_into(): layout_digest is %d bytes, not %zd", DIGEST_LEN,
                     PyBytes_GET_SIZE(digest));
        return NULL;
    }
    unsigned long long payload_len = PyLong_AsUnsignedLongLong(args[3]);
    if (payload_len == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t klen = PyBytes_GET_SIZE(key);
    if (klen > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "pack_header_into(): key too long");
        return NULL;
    }
    if (need_xxh3("pack_header_into") < 0) return NULL;
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
    memcpy(p, HEADER_MAGIC, 4);
    put_le(p + 4, FORMAT_VERSION, 2);
    put_le(p + 6, 0, 2);              /* flags */
    put_le(p + 8, (uint64_t)klen, 4);
    put_le(p + 12, payload_len, 8);
    put_le(p + 20, 0, 8);             /* the payload's checksum: the workers fill it in */
    put_le(p + 28, 0, 8);             /* seq */
    memcpy(p + 36, PyBytes_AS_STRING(digest), DIGEST_LEN);
    memcpy(p + FIXED_LEN, PyBytes_AS_STRING(key), (size_t)klen);
    put_le(p + FIXED_LEN + klen, xxh3(p, (size_t)(FIXED_LEN + klen)), 8);
    if (used > size) memset(p + size, 0, (size_t)(used - size));
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(size);
}

static PyMethodDef methods[] = {
    {"b32", b32, METH_O, "b32(key: bytes) -> str: RFC 4648 base32 of key, lowercase, without padding."},
    {"use_xxh3", use_xxh3, METH_O, "use_xxh3(address: int) -> None: hash with the XXH3_64bits there."},
    {"name_of", name_of, METH_O, "name_of(key: bytes) -> (shard, token): the fs tier's shard and file name."},
    {"pack_header_into", (PyCFunction)(void (*)(void))pack_header_into, METH_FASTCALL,
     "pack_header_into(block, used, key, payload_len, layout_digest) -> size: a header with a zero checksum."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "C twins of asynctier's per-chunk Python helpers.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
