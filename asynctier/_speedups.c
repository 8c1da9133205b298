/* Accelerators for per-chunk work on the event loop's thread, each with a Python twin that
 * is the reference and the fallback (asynctier.integrity._b32): built when a C compiler is
 * there, and the same results either way (tests/test_integrity_and_torch.py compares them).
 *
 * b32(key): a key's file-name token, RFC 4648 base32, lowercase, without padding. The fs
 * tier computes one per store, two per store that recycles a victim's file, one per load:
 * about 1 us each in Python on this project's machines, 0.1 us here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz234567";

static PyObject *b32(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "b32() takes bytes, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > PY_SSIZE_T_MAX / 8) return PyErr_NoMemory();
    PyObject *out = PyUnicode_New((8 * n + 4) / 5, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
    /* the low bits of acc hold the bits not written yet (the older ones shift out unread) */
    uint32_t acc = 0;
    int bits = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        acc = (acc << 8) | s[i];
        bits += 8;
        while (bits >= 5) {
            bits -= 5;
            *d++ = (Py_UCS1)ALPHABET[(acc >> bits) & 31];
        }
    }
    if (bits > 0) *d = (Py_UCS1)ALPHABET[(acc << (5 - bits)) & 31];
    return out;
}

static PyMethodDef methods[] = {
    {"b32", b32, METH_O, "b32(key: bytes) -> str: RFC 4648 base32 of key, lowercase, without padding."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "C twins of asynctier's per-chunk Python helpers.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
