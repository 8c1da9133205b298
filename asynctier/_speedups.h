/* What the files of asynctier._speedups share (_speedups.c: the per-chunk twins and the
 * module; _speedups_groups.c: a group job's descriptors and checks; _speedups_nvme.c: the nvme
 * tier's jobs' steps on its slot index; _speedups_nvme_runs.c: its jobs' runs, their
 * descriptors and outcomes; _speedups_lru.c: the LRU index's). */
#ifndef ASYNCTIER_SPEEDUPS_H
#define ASYNCTIER_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "engines/_nativeio.h" /* struct at_job and at_res: the workers' descriptors */

_Static_assert(sizeof(struct at_job) == 856, "struct at_job is asynctier.engines.native.JOB_LAYOUT");
_Static_assert(sizeof(struct at_res) == 24, "struct at_res is asynctier.engines.native.RESULT_LAYOUT");

#define SP_HIDDEN __attribute__((visibility("hidden")))

#define MAX_B32_KEY 96 /* longer keys are named by a hash (asynctier.integrity.key_token) */
#define N_SHARDS 256   /* asynctier.tiers.fs.layout.N_SHARDS */
#define FORMAT_VERSION 1 /* asynctier.spec.FORMAT_VERSION (the tests compare the headers) */
#define HEADER_MAGIC "ATKV"
#define FIXED_LEN 52 /* asynctier.integrity._FIXED: <4sHHIQQQ16s */
#define DIGEST_LEN 16

/* the XXH3_64bits the workers hash with (use_xxh3) */
SP_HIDDEN extern xxh3_fn xxh3;

/* The base32 of s[0:n] written at d (8n/5 characters, rounded up); the end. */
SP_HIDDEN char *b32_into(const unsigned char *s, Py_ssize_t n, char *d);
/* 0 once use_xxh3 was called, else -1 with RuntimeError naming fn. */
SP_HIDDEN int need_xxh3(const char *fn);
/* asynctier.integrity.pack_header(key, payload_len, csum, digest, seq) at p; its size. */
SP_HIDDEN Py_ssize_t put_header(unsigned char *p, const char *key, Py_ssize_t klen, uint64_t payload_len,
                                uint64_t csum, uint64_t seq, const char *digest);
/* Argument checks: 0, or -1 with an exception naming fn. */
SP_HIDDEN int check_key(PyObject *key, const char *fn);
SP_HIDDEN int check_named_key(PyObject *key, const char *fn);
SP_HIDDEN int check_digest(PyObject *digest, const char *fn);
SP_HIDDEN int check_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t want);
/* Exact ints only (see need_int in _speedups.c): 0, or -1 with TypeError, OverflowError or
 * ValueError. A twin that reads an int with anything else may run Python code midway. */
SP_HIDDEN int need_int(PyObject *v);
SP_HIDDEN int get_u64(PyObject *v, uint64_t *out);
SP_HIDDEN int get_ll(PyObject *v, long long *out);
SP_HIDDEN int get_i32(PyObject *v, int32_t *out, const char *fn, const char *what);
/* base + i * stride into *out; -1 with OverflowError naming fn past 2**64 - 1 (where the
 * reference's 64-bit field refuses it with struct.error). */
SP_HIDDEN int addr_at(uint64_t base, uint64_t i, uint64_t stride, uint64_t *out, const char *fn);
/* The items of seq in a tuple of the caller's own (TypeError msg if it is not a sequence):
 * PySequence_Fast hands a list back as it is, and Python code that runs midway may change
 * it; NULL with an error. */
SP_HIDDEN PyObject *own_tuple(PyObject *seq, const char *msg);
/* A tuple of the n new references in items, which it steals (NULL items: all are dropped and
 * NULL returned, the error theirs): what Py_BuildValue builds, without parsing a format for
 * each record or run of a call (slot_runs of 32 slots: 4.2 -> 3.7 us). */
SP_HIDDEN PyObject *tuple_of(int n, PyObject **items);

/* _speedups_groups.c */
SP_HIDDEN PyObject *pack_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *reads_failed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pack_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pack_recycles(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *jobs_failed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *split_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _speedups_nvme.c */
SP_HIDDEN PyObject *evict_oldest(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *release_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *take_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *begin_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *end_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *put_published(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pin_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *unpin_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pack_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _speedups_nvme_runs.c */
SP_HIDDEN PyObject *slot_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pack_slot_writes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *runs_written(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *pack_slot_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *runs_loaded(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _speedups_lru.c */
SP_HIDDEN PyObject *lru_reserve_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *lru_commit_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *lru_pin_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *lru_unpin_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
SP_HIDDEN PyObject *lru_removed_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* The LRUEntry type added to the module; -1 with an error. */
SP_HIDDEN int lru_add_types(PyObject *module);

#endif
