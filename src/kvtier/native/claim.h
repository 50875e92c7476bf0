/* A claim cell: the state of one abandonable load (kvtier.dataplane.abandonable), an aligned
 * int32 that a loading thread's native read and the scheduler's Python code both move, only by
 * compare-and-swap, so a load is claimed (and its row written) only while still pending. Used
 * by the disk tier's record reader (_recordread) and the shared tier's receive (_sockread). */
#ifndef KVTIER_CLAIM_H
#define KVTIER_CLAIM_H

#include <stdint.h>

enum kvtier_claim_state {
    KVTIER_CLAIM_PENDING = 0,
    KVTIER_CLAIM_COPYING = 1,
    KVTIER_CLAIM_DONE = 2,
    KVTIER_CLAIM_ABANDONED = 3,
    /* Claimed and written; no byte of the row changes any more. A reader leaves its loads
     * here, so a list read (read_claiming_many, exchange_claiming) does not hold a load it is
     * done with in COPYING, which the scheduler cannot abandon, while it reads the next ones. */
    KVTIER_CLAIM_WRITTEN = 4,
};

/* Move *cell from state from to state to; 1 if it was in from, else 0 (nothing changed). */
static inline int kvtier_claim_move(int32_t *cell, int32_t from, int32_t to) {
    return __atomic_compare_exchange_n(cell, &from, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* The state *cell is in now. */
static inline int32_t kvtier_claim_state(const int32_t *cell) {
    return __atomic_load_n(cell, __ATOMIC_ACQUIRE);
}

#ifdef Py_PYTHON_H
/* The claim cell in a writable buffer, or NULL with an error set when the buffer is too short
 * or not aligned for atomic access. */
static inline int32_t *kvtier_claim_cell(Py_buffer *cell) {
    if (cell->len < (Py_ssize_t)sizeof(int32_t) || (uintptr_t)cell->buf % sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "a claim cell is an aligned buffer of at least 4 bytes");
        return NULL;
    }
    return (int32_t *)cell->buf;
}
#endif

#endif
