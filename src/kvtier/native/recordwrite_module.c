/* kvtier.native._recordwrite: the Python binding of kvtier_write_record (recordwrite.c).
 *
 * Built like _recordread (setup.py; the stable ABI). The GIL is released once for a whole list
 * of records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "recordwrite.h"

struct record_args {
    PyObject *temp; /* bytes, owned */
    PyObject *final;
    Py_buffer header;
    Py_buffer payload;
    int have_header;
    int have_payload;
};

static void release_args(struct record_args *records, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_XDECREF(records[i].temp);
        Py_XDECREF(records[i].final);
        if (records[i].have_header)
            PyBuffer_Release(&records[i].header);
        if (records[i].have_payload)
            PyBuffer_Release(&records[i].payload);
    }
    PyMem_Free(records);
}

PyDoc_STRVAR(write_records_doc,
             "write_records(records, direct, datasync, drop_pages) -> [(status, errno), ...]\n\n"
             "Write each (temp, final, header, payload) of records (paths as bytes, buffers\n"
             "readable) as a file at temp and rename it to final, in one call without the GIL.\n"
             "See recordwrite.h for what each step does and the statuses.");

static PyObject *write_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *list;
    int direct, datasync, drop_pages;
    if (!PyArg_ParseTuple(args, "Oppp", &list, &direct, &datasync, &drop_pages))
        return NULL;
    PyObject *items = PySequence_Fast(list, "records must be a sequence");
    if (items == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Size(items);
    struct record_args *records = PyMem_Calloc(count ? (size_t)count : 1, sizeof *records);
    struct kvtier_write_result *results =
        PyMem_Calloc(count ? (size_t)count : 1, sizeof *results);
    if (records == NULL || results == NULL) {
        PyMem_Free(records);
        PyMem_Free(results);
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_GetItem(items, i);
        PyObject *temp, *final, *header, *payload;
        int ok = item != NULL &&
                 PyArg_ParseTuple(item, "O&O&OO", PyUnicode_FSConverter, &temp,
                                  PyUnicode_FSConverter, &final, &header, &payload);
        if (ok) {
            records[i].temp = temp;
            records[i].final = final;
            ok = PyObject_GetBuffer(header, &records[i].header, PyBUF_SIMPLE) == 0;
            records[i].have_header = ok;
            ok = ok && PyObject_GetBuffer(payload, &records[i].payload, PyBUF_SIMPLE) == 0;
            records[i].have_payload = ok;
        }
        Py_XDECREF(item);
        if (!ok) {
            release_args(records, i + 1);
            PyMem_Free(results);
            Py_DECREF(items);
            return NULL;
        }
    }
    Py_DECREF(items);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        kvtier_write_record(PyBytes_AsString(records[i].temp), PyBytes_AsString(records[i].final),
                            records[i].header.buf, (size_t)records[i].header.len,
                            records[i].payload.buf, (size_t)records[i].payload.len, direct,
                            datasync, drop_pages, &results[i]);
    Py_END_ALLOW_THREADS
    release_args(records, count);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *pair = Py_BuildValue("ii", results[i].status, results[i].error);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, i, pair);
    }
    PyMem_Free(results);
    return out;
}

static PyMethodDef methods[] = {
    {"write_records", write_records, METH_VARARGS, write_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordwrite", "kvtier's one-call record writer (recordwrite.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordwrite(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "OK", KVTIER_WRITE_OK) < 0 ||
        PyModule_AddIntConstant(m, "ERRNO", KVTIER_WRITE_ERRNO) < 0 ||
        PyModule_AddIntConstant(m, "DIRECT_REFUSED", KVTIER_WRITE_DIRECT_REFUSED) < 0 ||
        PyModule_AddIntConstant(m, "NO_FOLDER", KVTIER_WRITE_NO_FOLDER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
