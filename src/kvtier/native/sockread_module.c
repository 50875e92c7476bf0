/* kvtier.native._sockread: receive exactly n bytes from a socket into a buffer, without the GIL.
 *
 * Built like _recordread (setup.py; the stable ABI). The shared tier receives each record's
 * value with it: a Python recv_into loop takes the GIL back after every chunk the kernel hands
 * over (64 KiB to a few hundred KiB on loopback), and beside a busy Python thread (an engine's
 * loop) each of those can wait out the interpreter's switch interval: measured, a 5.6 MiB value
 * then arrived at 0.21 GB/s instead of 2.8. Here the GIL is released once for the whole value.
 *
 * The socket may be non-blocking (Python sockets with a timeout are): each wait for data is a
 * poll() bounded by timeout_ms, as Python's own recv_into bounds each call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Statuses of recv_exactly, as the Python side maps them. */
enum { RECV_DONE = 0, RECV_EOF = 1, RECV_TIMEOUT = 2, RECV_ERROR = 3 };

/* Receive into buf until len bytes arrived, the peer closed, a wait for data lasted timeout_ms
 * (negative: no bound), or an error; *got is what arrived, *error the errno of RECV_ERROR. */
static int recv_all(int fd, char *buf, size_t len, int timeout_ms, size_t *got, int *error) {
    size_t pos = 0;
    int status = RECV_DONE;
    while (pos < len) {
        ssize_t n = recv(fd, buf + pos, len - pos, 0);
        if (n > 0) {
            pos += (size_t)n;
            continue;
        }
        if (n == 0) {
            status = RECV_EOF;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *error = errno;
            status = RECV_ERROR;
            break;
        }
        struct pollfd waiting = {.fd = fd, .events = POLLIN};
        int ready = poll(&waiting, 1, timeout_ms);
        if (ready == 0) {
            status = RECV_TIMEOUT;
            break;
        }
        if (ready < 0 && errno != EINTR) {
            *error = errno;
            status = RECV_ERROR;
            break;
        }
    }
    *got = pos;
    return status;
}

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
    int error = 0, status = RECV_DONE;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && status == RECV_DONE; i++) {
        status = recv_all(fd, views[i].buf, (size_t)views[i].len, timeout_ms, &got, &error);
        total += got;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
    return Py_BuildValue("ini", status, (Py_ssize_t)total, error);
}

static PyMethodDef methods[] = {
    {"recv_exactly", recv_exactly, METH_VARARGS, recv_exactly_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kvtier.native._sockread",
    "A socket read of exactly n bytes in one call without the GIL (see kvtier.native).",
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
    if (m != NULL && (PyModule_AddIntConstant(m, "RECV_DONE", RECV_DONE) != 0 ||
                      PyModule_AddIntConstant(m, "RECV_EOF", RECV_EOF) != 0 ||
                      PyModule_AddIntConstant(m, "RECV_TIMEOUT", RECV_TIMEOUT) != 0 ||
                      PyModule_AddIntConstant(m, "RECV_ERROR", RECV_ERROR) != 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
