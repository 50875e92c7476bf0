/* kvtier.native._streamcopy: the Python binding of kvtier_copy_pages (streamcopy.c).
 *
 * Built by setup.py when kvtier is installed (pip) or by scripts/setup.sh for a clone; nothing
 * compiles at run time. The stable ABI (Py_LIMITED_API, set in setup.py) makes one build serve
 * every CPython >= 3.11.
 *
 * Why a real extension function rather than a ctypes library: the GIL is released explicitly
 * around the copy, so a long restore overlaps the engine's forward pass, and the call costs less
 * than ctypes' argument conversion.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "streamcopy.h"

PyDoc_STRVAR(copy_pages_doc,
             "copy_pages(n, dst, src, sizes) -> bytes copied\n\n"
             "dst, src and sizes are addresses of n-element uint64 arrays: page i of sizes[i]\n"
             "bytes is copied from address src[i] to address dst[i] with streaming stores.\n"
             "The caller keeps the arrays and the memory they point at alive and unshared for\n"
             "the call; the GIL is released while copying.");

static PyObject *copy_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "copy_pages(n, dst, src, sizes) takes 4 integers, got %zd",
                     nargs);
        return NULL;
    }
    uint64_t v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    /* A null array would crash the process; refuse it (an empty batch needs no arrays). */
    if (v[0] > 0 && (v[1] == 0 || v[2] == 0 || v[3] == 0)) {
        PyErr_SetString(PyExc_ValueError, "copy_pages: null dst, src or sizes address");
        return NULL;
    }
    uint64_t total;
    Py_BEGIN_ALLOW_THREADS
    total = kvtier_copy_pages(v[0], (const uint64_t *)(uintptr_t)v[1],
                              (const uint64_t *)(uintptr_t)v[2],
                              (const uint64_t *)(uintptr_t)v[3]);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(total);
}

static PyMethodDef methods[] = {
    {"copy_pages", (PyCFunction)(void (*)(void))copy_pages, METH_FASTCALL, copy_pages_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kvtier.native._streamcopy",
    "Batched page copies with streaming stores (see kvtier.native).",
    0,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__streamcopy(void) { return PyModule_Create(&module); }
