/* kvtier.native._recordread: the Python binding of kvtier_read_record (recordread.c).
 *
 * Built like _streamcopy (setup.py; the stable ABI). The GIL is released once for the whole
 * read, checks and checksum of one record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "recordread.h"
#include "xxh3.h"

PyDoc_STRVAR(read_record_doc,
             "read_record(path, header, payload, direct, checksum)\n"
             "    -> (status, errno, detail, detail2, direct_refused, payload_checksum)\n\n"
             "Read the record file at path (bytes) into the writable buffers header and\n"
             "payload in one call without the GIL, after checking it is a regular, private file\n"
             "of exactly their combined size. payload_checksum is the payload's XXH3-64 when\n"
             "checksum is true and the header names XXH3-64, else None. See recordread.h for\n"
             "the statuses.");

static PyObject *read_record(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    Py_buffer header, payload;
    int direct, checksum;
    if (!PyArg_ParseTuple(args, "yw*w*pp", &path, &header, &payload, &direct, &checksum))
        return NULL;
    struct kvtier_read_result result;
    Py_BEGIN_ALLOW_THREADS
    kvtier_read_record(path, header.buf, (size_t)header.len, payload.buf, (size_t)payload.len,
                       direct, checksum, &result);
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
    return Py_BuildValue("iiKKNN", result.status, result.error,
                         (unsigned long long)result.detail, (unsigned long long)result.detail2,
                         PyBool_FromLong(result.direct_refused), payload_checksum);
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
