/* kvtier.native._sockread: the Python binding of the shared tier's GIL-free socket receives
 * (sockread.c says why they are native).
 *
 * Built like _recordread (setup.py; the stable ABI). recv_exactly receives one value into
 * buffers; exchange_claiming sends a thread's share of GETs and lands their values in the
 * loads' rows under their claims. Each waits for data with poll() bounded by timeout_ms, as
 * Python's own socket calls bound each call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "claim.h"
#include "sockread.h"

PyDoc_STRVAR(recv_exactly_doc,
             "recv_exactly(fd, buffers, timeout_ms) -> (status, received, errno)\n\n"
             "Receive into each writable buffer of the tuple buffers in turn until all are\n"
             "full, in one call without the GIL. status: 0 full, 1 the peer closed first, 2 no\n"
             "data for timeout_ms (negative: wait without bound), 3 a socket error (errno).\n"
             "received: the bytes that arrived, over all buffers.");

/* Most buffers one call fills (a value's payload and its trailer need two). */
#define MAX_BUFFERS 8

static PyObject *recv_exactly(PyObject *self, PyObject *args) {
    (void)self;
    int fd, timeout_ms;
    PyObject *buffers;
    if (!PyArg_ParseTuple(args, "iO!i", &fd, &PyTuple_Type, &buffers, &timeout_ms))
        return NULL;
    Py_ssize_t count = PyTuple_Size(buffers);
    if (count < 0)
        return NULL;
    if (count > MAX_BUFFERS) {
        PyErr_SetString(PyExc_ValueError, "recv_exactly: at most 8 buffers");
        return NULL;
    }
    Py_buffer views[MAX_BUFFERS];
    Py_ssize_t held = 0;
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PyTuple_GetItem(buffers, held), &views[held], PyBUF_WRITABLE) != 0)
            break;
    }
    if (held < count) {
        for (Py_ssize_t i = 0; i < held; i++)
            PyBuffer_Release(&views[i]);
        return NULL;
    }
    size_t total = 0, got = 0;
    int error = 0, status = KVTIER_SOCK_DONE;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && status == KVTIER_SOCK_DONE; i++) {
        status = kvtier_recv_all(fd, views[i].buf, (size_t)views[i].len, timeout_ms, &got,
                                 &error);
        total += got;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
    return Py_BuildValue("ini", status, (Py_ssize_t)total, error);
}

PyDoc_STRVAR(exchange_claiming_doc,
             "exchange_claiming(fd, requests, lines, headers, bounce, outs, cells, window,\n"
             "                  checksum, timeout_ms, lock=None)\n"
             "    -> (status, decided, settled, errno, unparsed, answers)\n\n"
             "Send each packed GET of the list requests, at most window awaiting a reply, and\n"
             "receive the replies in turn, in one call without the GIL. A GET whose claim cell\n"
             "cells[i] is no longer pending when its turn to be sent comes is not sent. A reply\n"
             "whose first line is lines[i] has its first len(headers) // n bytes put in\n"
             "headers (back to back) and the rest, len(outs[i]) bytes, received into bounce,\n"
             "then copied into outs[i] once cells[i] moved from pending to copying (then on to\n"
             "written). It stops at the first reply of another form (status RECV_OTHER_REPLY:\n"
             "unparsed holds the bytes read of it) or a socket fault. answers: per GET decided\n"
             "(sent or not), (GET_COPIED, GET_NOT_CLAIMED, GET_NIL, GET_NOT_SENT or\n"
             "GET_AWAITING, the payload's XXH3-64 or None); the first settled are done with.\n"
             "lock: one of new_lock() or None; exchanges given the same lock run one at a\n"
             "time, the lock taken and given back without the GIL.");

#define LOCK_NAME "kvtier.native._sockread.exchange_lock"

static void free_lock(PyObject *capsule) {
    pthread_mutex_t *mutex = PyCapsule_GetPointer(capsule, LOCK_NAME);
    if (mutex != NULL) {
        pthread_mutex_destroy(mutex);
        free(mutex);
    }
}

PyDoc_STRVAR(new_lock_doc,
             "new_lock() -> lock\n\n"
             "A lock for exchange_claiming, taken and given back without the GIL: the exchanges\n"
             "given the same lock run one at a time.");

static PyObject *new_lock(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    pthread_mutex_t *mutex = malloc(sizeof *mutex);
    if (mutex == NULL)
        return PyErr_NoMemory();
    if (pthread_mutex_init(mutex, NULL) != 0) {
        free(mutex);
        PyErr_SetString(PyExc_OSError, "pthread_mutex_init failed");
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(mutex, LOCK_NAME, free_lock);
    if (capsule == NULL) {
        pthread_mutex_destroy(mutex);
        free(mutex);
    }
    return capsule;
}

static PyObject *exchange_claiming(PyObject *self, PyObject *args) {
    (void)self;
    int fd, window, checksum, timeout_ms;
    PyObject *requests, *lines, *outs_list, *cells_list, *lock = Py_None;
    Py_buffer headers, bounce;
    if (!PyArg_ParseTuple(args, "iO!O!w*w*O!O!ipi|O", &fd, &PyList_Type, &requests,
                          &PyList_Type, &lines, &headers, &bounce, &PyList_Type, &outs_list,
                          &PyList_Type, &cells_list, &window, &checksum, &timeout_ms, &lock))
        return NULL;
    pthread_mutex_t *mutex = NULL;
    if (lock != Py_None) {
        mutex = PyCapsule_GetPointer(lock, LOCK_NAME);
        if (mutex == NULL) {
            PyBuffer_Release(&headers);
            PyBuffer_Release(&bounce);
            return NULL;
        }
    }
    Py_ssize_t n = PyList_Size(requests);
    PyObject *answer = NULL;
    struct kvtier_get *gets = NULL;
    Py_buffer *outs = NULL, *cells = NULL;
    Py_ssize_t got_outs = 0, got_cells = 0;
    if (n == 0 || PyList_Size(lines) != n || PyList_Size(outs_list) != n ||
        PyList_Size(cells_list) != n || headers.len % n || window < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "requests, lines, outs, cells and headers must match; window >= 1");
        goto done;
    }
    size_t header_len = (size_t)(headers.len / n);
    gets = PyMem_Calloc((size_t)n, sizeof(struct kvtier_get));
    outs = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    cells = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    if (!gets || !outs || !cells) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *request = PyList_GetItem(requests, i), *line = PyList_GetItem(lines, i);
        if (!PyBytes_Check(request) || !PyBytes_Check(line) || PyBytes_Size(line) < 3 ||
            PyBytes_Size(line) > KVTIER_LINE_MAX) {
            PyErr_SetString(PyExc_TypeError, "requests and lines are bytes (lines: 3-32 bytes)");
            goto done;
        }
        if (PyObject_GetBuffer(PyList_GetItem(outs_list, i), &outs[i], PyBUF_WRITABLE) < 0)
            goto done;
        got_outs++;
        if (PyObject_GetBuffer(PyList_GetItem(cells_list, i), &cells[i], PyBUF_WRITABLE) < 0)
            goto done;
        got_cells++;
        int32_t *cell = kvtier_claim_cell(&cells[i]);
        if (cell == NULL)
            goto done;
        if (outs[i].len > bounce.len) {
            PyErr_SetString(PyExc_ValueError, "bounce must hold every out");
            goto done;
        }
        /* The bytes objects stay alive: the list holds them, and the caller holds the list. */
        gets[i] = (struct kvtier_get){
            .request = (const uint8_t *)PyBytes_AsString(request),
            .request_len = (size_t)PyBytes_Size(request),
            .line = (const uint8_t *)PyBytes_AsString(line),
            .line_len = (size_t)PyBytes_Size(line),
            .header = (uint8_t *)headers.buf + header_len * (size_t)i,
            .out = outs[i].buf,
            .payload_len = (size_t)outs[i].len,
            .cell = cell,
        };
    }
    struct kvtier_exchange result;
    Py_BEGIN_ALLOW_THREADS
    if (mutex != NULL)
        pthread_mutex_lock(mutex);
    kvtier_exchange_gets(fd, gets, (size_t)n, header_len, bounce.buf, (size_t)window, checksum,
                         timeout_ms, &result);
    if (mutex != NULL)
        pthread_mutex_unlock(mutex);
    Py_END_ALLOW_THREADS
    PyObject *answers = PyList_New((Py_ssize_t)result.decided);
    if (answers == NULL)
        goto done;
    for (size_t i = 0; i < result.decided; i++) {
        PyObject *payload_checksum =
            gets[i].checksummed ? PyLong_FromUnsignedLongLong(gets[i].payload_checksum)
                                : Py_NewRef(Py_None);
        PyObject *item = payload_checksum == NULL
                             ? NULL
                             : Py_BuildValue("iN", gets[i].landed, payload_checksum);
        if (item == NULL) {
            Py_DECREF(answers);
            goto done;
        }
        PyList_SetItem(answers, (Py_ssize_t)i, item);
    }
    answer = Py_BuildValue("innNy#N", result.status, (Py_ssize_t)result.decided,
                           (Py_ssize_t)result.settled, PyLong_FromLong(result.error),
                           (const char *)result.unparsed, (Py_ssize_t)result.unparsed_len,
                           answers);
done:
    for (Py_ssize_t i = 0; i < got_outs; i++)
        PyBuffer_Release(&outs[i]);
    for (Py_ssize_t i = 0; i < got_cells; i++)
        PyBuffer_Release(&cells[i]);
    PyMem_Free(gets);
    PyMem_Free(outs);
    PyMem_Free(cells);
    PyBuffer_Release(&headers);
    PyBuffer_Release(&bounce);
    return answer;
}

static PyMethodDef methods[] = {
    {"recv_exactly", recv_exactly, METH_VARARGS, recv_exactly_doc},
    {"exchange_claiming", exchange_claiming, METH_VARARGS, exchange_claiming_doc},
    {"new_lock", new_lock, METH_NOARGS, new_lock_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kvtier.native._sockread",
    "The shared tier's socket receives, each in one call without the GIL (see kvtier.native).",
    0,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__sockread(void) {
    PyObject *m = PyModule_Create(&module);
    /* The statuses, by name, for the Python side (kvtier.store.shared.readinto). */
    if (m != NULL &&
        (PyModule_AddIntConstant(m, "RECV_DONE", KVTIER_SOCK_DONE) != 0 ||
         PyModule_AddIntConstant(m, "RECV_EOF", KVTIER_SOCK_EOF) != 0 ||
         PyModule_AddIntConstant(m, "RECV_TIMEOUT", KVTIER_SOCK_TIMEOUT) != 0 ||
         PyModule_AddIntConstant(m, "RECV_ERROR", KVTIER_SOCK_ERROR) != 0 ||
         PyModule_AddIntConstant(m, "RECV_OTHER_REPLY", KVTIER_SOCK_OTHER_REPLY) != 0 ||
         PyModule_AddIntConstant(m, "RECV_BAD_TRAILER", KVTIER_SOCK_BAD_TRAILER) != 0 ||
         PyModule_AddIntConstant(m, "GET_NOT_CLAIMED", KVTIER_GET_NOT_CLAIMED) != 0 ||
         PyModule_AddIntConstant(m, "GET_COPIED", KVTIER_GET_COPIED) != 0 ||
         PyModule_AddIntConstant(m, "GET_NIL", KVTIER_GET_NIL) != 0 ||
         PyModule_AddIntConstant(m, "GET_NOT_SENT", KVTIER_GET_NOT_SENT) != 0 ||
         PyModule_AddIntConstant(m, "GET_AWAITING", KVTIER_GET_AWAITING) != 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
