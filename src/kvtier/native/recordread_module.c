/* kvtier.native._recordread: the Python binding of kvtier_read_record (recordread.c).
 *
 * Built like _streamcopy (setup.py; the stable ABI). The GIL is released once for the whole
 * read, checks and checksum of one record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>

#include "recordread.h"
#include "xxh3.h"

/* The payload's checksum as a Python int, or None when it was not computed. */
static PyObject *checksum_or_none(const struct kvtier_read_result *result) {
    if (result->checksummed)
        return PyLong_FromUnsignedLongLong(result->payload_checksum);
    return Py_NewRef(Py_None);
}

PyDoc_STRVAR(read_record_doc,
             "read_record(path, header, payload, direct, checksum, page_cache)\n"
             "    -> (status, errno, detail, detail2, direct_refused, payload_checksum,\n"
             "        from_page_cache)\n\n"
             "Read the record file at path (bytes) into the writable buffers header and\n"
             "payload in one call without the GIL, after checking it is a regular, private file\n"
             "of exactly their combined size. payload_checksum is the payload's XXH3-64 when\n"
             "checksum is true and the header names XXH3-64, else None. With direct and\n"
             "page_cache, a file the page cache holds whole is read buffered (from_page_cache\n"
             "true) instead of O_DIRECT. See recordread.h for the statuses.");

static PyObject *read_record(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    Py_buffer header, payload;
    int direct, checksum, page_cache;
    if (!PyArg_ParseTuple(args, "yw*w*ppp", &path, &header, &payload, &direct, &checksum,
                          &page_cache))
        return NULL;
    struct kvtier_read_result result;
    Py_BEGIN_ALLOW_THREADS
    kvtier_read_record(path, header.buf, (size_t)header.len, payload.buf, (size_t)payload.len,
                       direct, checksum, page_cache, &result);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    PyObject *payload_checksum = checksum_or_none(&result);
    if (payload_checksum == NULL)
        return NULL;
    return Py_BuildValue("iiKKNNN", result.status, result.error,
                         (unsigned long long)result.detail, (unsigned long long)result.detail2,
                         PyBool_FromLong(result.direct_refused), payload_checksum,
                         PyBool_FromLong(result.from_page_cache));
}

PyDoc_STRVAR(read_unless_resident_doc,
             "read_unless_resident(path, header, payload, direct, checksum)\n"
             "    -> (fd, status, errno, detail, detail2, direct_refused, payload_checksum)\n\n"
             "read_record's checks, then: when the page cache holds the whole file, nothing is\n"
             "read and fd is an open descriptor for read_resident (status 0); otherwise the\n"
             "record is read into header and payload as read_record reads it, and fd is -1.\n"
             "One call without the GIL either way.");

static PyObject *read_unless_resident(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    Py_buffer header, payload;
    int direct, checksum;
    if (!PyArg_ParseTuple(args, "yw*w*pp", &path, &header, &payload, &direct, &checksum))
        return NULL;
    struct kvtier_read_result result;
    int fd;
    Py_BEGIN_ALLOW_THREADS
    fd = kvtier_read_unless_resident(path, header.buf, (size_t)header.len, payload.buf,
                                     (size_t)payload.len, direct, checksum, &result);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    PyObject *payload_checksum = checksum_or_none(&result);
    if (payload_checksum == NULL)
        return NULL;
    return Py_BuildValue("iiiKKNN", fd, result.status, result.error,
                         (unsigned long long)result.detail, (unsigned long long)result.detail2,
                         PyBool_FromLong(result.direct_refused), payload_checksum);
}

PyDoc_STRVAR(read_resident_doc,
             "read_resident(fd, header, payload, checksum) -> (status, errno, detail,\n"
             "    nowait_refused, payload_checksum)\n\n"
             "Read the record open on fd (from read_unless_resident) into header and payload without\n"
             "the GIL, never waiting for the device (RWF_NOWAIT), hashing each chunk as it\n"
             "lands; closes fd. Status 6: a page left the page cache meanwhile, or the kernel\n"
             "refused RWF_NOWAIT (nowait_refused): payload may be partly written.");

static PyObject *read_resident(PyObject *self, PyObject *args) {
    (void)self;
    int fd, checksum;
    Py_buffer header, payload;
    if (!PyArg_ParseTuple(args, "iw*w*p", &fd, &header, &payload, &checksum))
        return NULL;
    struct kvtier_read_result result;
    Py_BEGIN_ALLOW_THREADS
    kvtier_read_resident(fd, header.buf, (size_t)header.len, payload.buf, (size_t)payload.len,
                         checksum, &result);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    PyObject *payload_checksum = checksum_or_none(&result);
    if (payload_checksum == NULL)
        return NULL;
    return Py_BuildValue("iiKNN", result.status, result.error,
                         (unsigned long long)result.detail,
                         PyBool_FromLong(result.nowait_refused), payload_checksum);
}

PyDoc_STRVAR(read_claiming_doc,
             "read_claiming(path, header, bounce, out, cell, direct, checksum)\n"
             "    -> (into, status, errno, detail, detail2, direct_refused, nowait_refused,\n"
             "        payload_checksum)\n\n"
             "read_unless_resident into bounce, move the claim cell from pending to copying,\n"
             "and copy bounce into out; when the page cache holds the record, claim first and\n"
             "read_resident into out instead. One call without the GIL. into: 0 the read failed\n"
             "(status), 1 claimed and read into out from the page cache, 2 the load was no\n"
             "longer pending (out untouched), 3 read into bounce, claimed and copied into out,\n"
             "4 read into bounce but no longer pending (out untouched).\n"
             "bounce and out are of one length.");

static PyObject *read_claiming(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    Py_buffer header, bounce, out, cell;
    int direct, checksum;
    if (!PyArg_ParseTuple(args, "yw*w*w*w*pp", &path, &header, &bounce, &out, &cell, &direct,
                          &checksum))
        return NULL;
    int32_t *state = kvtier_claim_cell(&cell);
    if (state != NULL && bounce.len != out.len) {
        PyErr_SetString(PyExc_ValueError, "bounce and out must be of one length");
        state = NULL;
    }
    struct kvtier_read_result result = {0};
    int into = KVTIER_INTO_BOUNCE;
    if (state != NULL) {
        Py_BEGIN_ALLOW_THREADS
        into = kvtier_read_claiming(path, header.buf, (size_t)header.len, bounce.buf, out.buf,
                                    (size_t)out.len, state, direct, checksum, &result);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&header);
    PyBuffer_Release(&bounce);
    PyBuffer_Release(&out);
    PyBuffer_Release(&cell);
    if (state == NULL)
        return NULL;
    PyObject *payload_checksum = checksum_or_none(&result);
    if (payload_checksum == NULL)
        return NULL;
    return Py_BuildValue("iiiKKNNN", into, result.status, result.error,
                         (unsigned long long)result.detail, (unsigned long long)result.detail2,
                         PyBool_FromLong(result.direct_refused),
                         PyBool_FromLong(result.nowait_refused), payload_checksum);
}

PyDoc_STRVAR(read_claiming_many_doc,
             "read_claiming_many(paths, headers, bounce, outs, cells, direct, checksum)\n"
             "    -> list of read_claiming's tuples, one per path\n\n"
             "read_claiming for each path in turn, in one call without the GIL: one GIL\n"
             "hand-over for the whole list. headers holds one header buffer per path, back to\n"
             "back; outs and cells are lists of one length with paths. A load no longer pending\n"
             "when its turn comes is not read at all (into 2).");

static PyObject *read_claiming_many(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths, *outs_list, *cells_list;
    Py_buffer headers, bounce;
    int direct, checksum;
    if (!PyArg_ParseTuple(args, "O!w*w*O!O!pp", &PyList_Type, &paths, &headers, &bounce,
                          &PyList_Type, &outs_list, &PyList_Type, &cells_list, &direct,
                          &checksum))
        return NULL;
    Py_ssize_t n = PyList_Size(paths);
    PyObject *answer = NULL;
    Py_buffer *outs = NULL, *cells = NULL;
    const char **names = NULL;
    int *into = NULL;
    struct kvtier_read_result *results = NULL;
    Py_ssize_t got_outs = 0, got_cells = 0;
    if (PyList_Size(outs_list) != n || PyList_Size(cells_list) != n || n == 0 ||
        headers.len / n < 4096 || headers.len % n) {
        PyErr_SetString(PyExc_ValueError, "paths, outs, cells and headers must match");
        goto done;
    }
    size_t header_len = (size_t)(headers.len / n);
    outs = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    cells = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
    names = PyMem_Calloc((size_t)n, sizeof(char *));
    into = PyMem_Calloc((size_t)n, sizeof(int));
    results = PyMem_Calloc((size_t)n, sizeof(struct kvtier_read_result));
    if (!outs || !cells || !names || !into || !results) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = PyList_GetItem(paths, i);
        if (!PyBytes_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "paths are bytes");
            goto done;
        }
        names[i] = PyBytes_AsString(path);
        if (PyObject_GetBuffer(PyList_GetItem(outs_list, i), &outs[i], PyBUF_WRITABLE) < 0)
            goto done;
        got_outs++;
        if (PyObject_GetBuffer(PyList_GetItem(cells_list, i), &cells[i], PyBUF_WRITABLE) < 0)
            goto done;
        got_cells++;
        if (kvtier_claim_cell(&cells[i]) == NULL)
            goto done;
        if (outs[i].len != bounce.len) {
            PyErr_SetString(PyExc_ValueError, "bounce and every out must be of one length");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t *state = (int32_t *)cells[i].buf;
        if (kvtier_claim_state(state) != KVTIER_CLAIM_PENDING) {
            into[i] = KVTIER_ABANDONED;
            continue;
        }
        into[i] = kvtier_read_claiming(names[i], (uint8_t *)headers.buf + header_len * (size_t)i,
                                       header_len, bounce.buf, outs[i].buf, (size_t)outs[i].len,
                                       state, direct, checksum, &results[i]);
    }
    Py_END_ALLOW_THREADS
    answer = PyList_New(n);
    if (answer == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *payload_checksum = checksum_or_none(&results[i]);
        PyObject *item = payload_checksum == NULL ? NULL : Py_BuildValue(
            "iiiKKNNN", into[i], results[i].status, results[i].error,
            (unsigned long long)results[i].detail, (unsigned long long)results[i].detail2,
            PyBool_FromLong(results[i].direct_refused),
            PyBool_FromLong(results[i].nowait_refused), payload_checksum);
        if (item == NULL) {
            Py_CLEAR(answer);
            goto done;
        }
        PyList_SetItem(answer, i, item);
    }
done:
    for (Py_ssize_t i = 0; i < got_outs; i++)
        PyBuffer_Release(&outs[i]);
    for (Py_ssize_t i = 0; i < got_cells; i++)
        PyBuffer_Release(&cells[i]);
    PyMem_Free(outs);
    PyMem_Free(cells);
    PyMem_Free(names);
    PyMem_Free(into);
    PyMem_Free(results);
    PyBuffer_Release(&headers);
    PyBuffer_Release(&bounce);
    return answer;
}

PyDoc_STRVAR(claim_move_doc,
             "claim_move(cell, from, to) -> whether the claim cell was in state from and is\n"
             "now in state to (one compare-and-swap; see recordread.h for the states).");

static PyObject *claim_move(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer cell;
    int from, to;
    if (!PyArg_ParseTuple(args, "w*ii", &cell, &from, &to))
        return NULL;
    int32_t *state = kvtier_claim_cell(&cell);
    int moved = state != NULL && kvtier_claim_move(state, from, to);
    PyBuffer_Release(&cell);
    if (state == NULL)
        return NULL;
    return PyBool_FromLong(moved);
}

PyDoc_STRVAR(claim_state_doc, "claim_state(cell) -> the state the claim cell is in now.");

static PyObject *claim_state(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer cell;
    if (!PyArg_ParseTuple(args, "w*", &cell))
        return NULL;
    int32_t *state = kvtier_claim_cell(&cell);
    int32_t now = state != NULL ? kvtier_claim_state(state) : 0;
    PyBuffer_Release(&cell);
    if (state == NULL)
        return NULL;
    return PyLong_FromLong(now);
}

PyDoc_STRVAR(resident_doc,
             "resident(path) -> whether the page cache holds every page of the file at path\n"
             "(bytes; not followed if a symlink), by the probe read_record uses. It reads\n"
             "nothing. Only for files of this user: the kernel answers for no other.");

static PyObject *resident(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path_obj))
        return NULL;
    const char *path = PyBytes_AsString(path_obj);
    int found;
    Py_BEGIN_ALLOW_THREADS
    found = kvtier_path_resident(path);
    Py_END_ALLOW_THREADS
    if (found < 0) {
        errno = -found;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
        Py_DECREF(path_obj);
        return NULL;
    }
    Py_DECREF(path_obj);
    return PyBool_FromLong(found);
}

PyDoc_STRVAR(residency_probe_doc,
             "residency_probe() -> \"cachestat\" or \"mincore\": how resident() and\n"
             "read_record ask the kernel in this process (mincore where the kernel predates\n"
             "cachestat, Linux 6.5).");

static PyObject *residency_probe(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(kvtier_residency_probe());
}

PyDoc_STRVAR(force_mincore_doc,
             "force_mincore(force) -> None. Tests only: probe with mincore as on a kernel\n"
             "without cachestat, so that path is tested on every kernel.");

static PyObject *force_mincore(PyObject *self, PyObject *args) {
    (void)self;
    int force;
    if (!PyArg_ParseTuple(args, "p", &force))
        return NULL;
    kvtier_force_mincore(force);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(xxh3_64_doc,
             "xxh3_64(data) -> XXH3-64 of a buffer of at least 241 bytes (the reader's\n"
             "checksum, exposed so tests compare it with the xxhash package).");

static PyObject *xxh3_64(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    if (data.len < KVTIER_XXH3_LONG_MIN) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "xxh3_64 hashes at least %d bytes", KVTIER_XXH3_LONG_MIN);
        return NULL;
    }
    uint64_t digest;
    Py_BEGIN_ALLOW_THREADS
    digest = kvtier_xxh3_64_long(data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(digest);
}

PyDoc_STRVAR(xxh3_64_many_doc,
             "xxh3_64_many(buffers) -> [XXH3-64 of each], every buffer of at least 241 bytes,\n"
             "hashed with the GIL given up once for them all: a batch of records' checksums\n"
             "costs the writing thread one wait for the GIL instead of one per record.");

static PyObject *xxh3_64_many(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg;
    if (!PyArg_ParseTuple(args, "O", &arg))
        return NULL;
    PyObject *seq = PySequence_Tuple(arg);
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_Size(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Py_buffer));
    uint64_t *digests = PyMem_Calloc((size_t)(count ? count : 1), sizeof(uint64_t));
    PyObject *result = NULL;
    Py_ssize_t held = 0;
    if (views == NULL || digests == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < count; held++) {
        PyObject *item = PyTuple_GetItem(seq, held);
        if (PyObject_GetBuffer(item, &views[held], PyBUF_SIMPLE) != 0)
            goto done;
        if (views[held].len < KVTIER_XXH3_LONG_MIN) {
            PyErr_Format(PyExc_ValueError, "xxh3_64_many hashes at least %d bytes a buffer",
                         KVTIER_XXH3_LONG_MIN);
            held++;
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        digests[i] = kvtier_xxh3_64_long(views[i].buf, (size_t)views[i].len);
    Py_END_ALLOW_THREADS
    result = PyList_New(count);
    for (Py_ssize_t i = 0; result != NULL && i < count; i++) {
        PyObject *digest = PyLong_FromUnsignedLongLong(digests[i]);
        if (digest == NULL || PyList_SetItem(result, i, digest) != 0) {
            Py_CLEAR(result);
            break;
        }
    }
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(digests);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"read_record", read_record, METH_VARARGS, read_record_doc},
    {"read_unless_resident", read_unless_resident, METH_VARARGS, read_unless_resident_doc},
    {"read_resident", read_resident, METH_VARARGS, read_resident_doc},
    {"read_claiming", read_claiming, METH_VARARGS, read_claiming_doc},
    {"read_claiming_many", read_claiming_many, METH_VARARGS, read_claiming_many_doc},
    {"claim_move", claim_move, METH_VARARGS, claim_move_doc},
    {"claim_state", claim_state, METH_VARARGS, claim_state_doc},
    {"resident", resident, METH_VARARGS, resident_doc},
    {"residency_probe", residency_probe, METH_NOARGS, residency_probe_doc},
    {"force_mincore", force_mincore, METH_VARARGS, force_mincore_doc},
    {"xxh3_64", xxh3_64, METH_VARARGS, xxh3_64_doc},
    {"xxh3_64_many", xxh3_64_many, METH_VARARGS, xxh3_64_many_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kvtier.native._recordread",
    "One record file read, checked and hashed per call without the GIL (see kvtier.native).",
    0,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__recordread(void) {
    PyObject *m = PyModule_Create(&module);
    /* Tests read records of lengths around a chunk's edges. */
    if (m != NULL && PyModule_AddIntConstant(m, "RESIDENT_CHUNK", KVTIER_RESIDENT_CHUNK) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
