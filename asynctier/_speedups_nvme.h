/* asynctier._speedups, the nvme tier's slot index as the C twins of tiers/nvme/bulk.py see it:
 * what a call reads of a SlotIndex (struct index, opened and closed around each call), and
 * the SlotIndex methods those calls share (_speedups_nvme_index.c). */
#ifndef ASYNCTIER_SPEEDUPS_NVME_H
#define ASYNCTIER_SPEEDUPS_NVME_H

#include "_speedups.h"

/* What a call uses of the SlotIndex: new references to its containers, its arrays' buffers,
 * the LRU list's ends (written back by ix_close when `moved`). */
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

SP_HIDDEN void ix_close(struct index *x);
SP_HIDDEN int ix_open(struct index *x, PyObject *obj, int need, const char *fn);
SP_HIDDEN int ix_hand_ends(struct index *x);
SP_HIDDEN int ix_take_ends(struct index *x, const char *fn);
SP_HIDDEN long ix_slot_of(struct index *x, PyObject *v, const char *fn);
SP_HIDDEN int ix_check_u64_range(uint64_t first, Py_ssize_t m, const char *fn);
SP_HIDDEN long ix_next_of(struct index *x, long s, const char *fn);
SP_HIDDEN int ix_unlink(struct index *x, long s);
SP_HIDDEN void ix_link_tail(struct index *x, long s);
SP_HIDDEN int ix_pinned(struct index *x, PyObject *s);
SP_HIDDEN int ix_release(struct index *x, long slot, uint64_t ticket);
SP_HIDDEN int ix_drop(struct index *x, PyObject *key);
SP_HIDDEN PyObject *ix_record(PyObject *key, long slot, uint64_t seq, uint64_t csum);
SP_HIDDEN int ix_count_write(struct index *x, PyObject *key, long by);

#endif
