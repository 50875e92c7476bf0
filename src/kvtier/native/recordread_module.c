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
    PyObject *payload_checksum;
    if (result.checksummed) {
        payload_checksum = PyLong_FromUnsignedLongLong(result.payload_checksum);
        if (payload_checksum == NULL)
            return NULL;
    } else {
        payload_checksum = Py_NewRef(Py_None);
    }
    return Py_BuildValue("iiKKNNN", result.status, result.error,
                         (unsigned long long)result.detail, (unsigned long long)result.detail2,
                         PyBool_FromLong(result.direct_refused), payload_checksum,
                         PyBool_FromLong(result.from_page_cache));
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

static PyMethodDef methods[] = {
    {"read_record", read_record, METH_VARARGS, read_record_doc},
    {"resident", resident, METH_VARARGS, resident_doc},
    {"residency_probe", residency_probe, METH_NOARGS, residency_probe_doc},
    {"force_mincore", force_mincore, METH_VARARGS, force_mincore_doc},
    {"xxh3_64", xxh3_64, METH_VARARGS, xxh3_64_doc},
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

PyMODINIT_FUNC PyInit__recordread(void) { return PyModule_Create(&module); }
