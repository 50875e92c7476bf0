/* kvtier.native._recordwrite: the Python binding of kvtier_write_record (recordwrite.c).
 *
 * Built like _recordread (setup.py; the stable ABI). The GIL is released once for a whole list
 * of records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

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

/* The paths of a sequence of bytes objects as C strings (PyMem_Free them), borrowed from
 * *held, a tuple the caller releases (Py_XDECREF, also on failure); NULL with an exception
 * set. One prologue for the calls below that take a list of paths. */
static const char **path_names(PyObject *arg, PyObject **held, Py_ssize_t *count) {
    *held = PySequence_Tuple(arg);
    if (*held == NULL)
        return NULL;
    *count = PyTuple_Size(*held);
    const char **names = PyMem_Calloc(*count ? (size_t)*count : 1, sizeof *names);
    if (names == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *count; i++) {
        names[i] = PyBytes_AsString(PyTuple_GetItem(*held, i));
        if (names[i] == NULL) {
            PyMem_Free(names);
            return NULL;
        }
    }
    return names;
}

/* [(st_size, st_blocks) or None, ...]: found[i]'s where skipped[i] is 0, else None (a path
 * that is not what was asked for, or an errno); NULL with an exception set. */
static PyObject *size_list(const struct stat *found, const int *skipped, Py_ssize_t count) {
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *item = skipped[i] == 0 ? Py_BuildValue("LL", (long long)found[i].st_size,
                                                         (long long)found[i].st_blocks)
                                         : (Py_INCREF(Py_None), Py_None);
        if (item == NULL || PyList_SetItem(out, i, item) != 0)
            Py_CLEAR(out);
    }
    return out;
}

PyDoc_STRVAR(folder_sizes_doc,
             "folder_sizes(paths) -> [(st_size, st_blocks) or None, ...]\n\n"
             "lstat each path (bytes) in one call without the GIL: a folder's size and\n"
             "512-byte blocks, None for anything else or an error. The disk store measures\n"
             "the folders a batch of puts wrote into this way (kvtier.store.disk.folders).");

static PyObject *folder_sizes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg, *paths = NULL, *out = NULL;
    Py_ssize_t count = 0;
    if (!PyArg_ParseTuple(args, "O", &arg))
        return NULL;
    const char **names = path_names(arg, &paths, &count);
    struct stat *found = PyMem_Calloc(count ? (size_t)count : 1, sizeof *found);
    int *not_dir = PyMem_Calloc(count ? (size_t)count : 1, sizeof *not_dir);
    if (names == NULL)
        goto done;
    if (found == NULL || not_dir == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        not_dir[i] = !(lstat(names[i], &found[i]) == 0 && S_ISDIR(found[i].st_mode));
    Py_END_ALLOW_THREADS
    out = size_list(found, not_dir, count);
done:
    PyMem_Free(found);
    PyMem_Free(not_dir);
    PyMem_Free(names);
    Py_XDECREF(paths);
    return out;
}

PyDoc_STRVAR(file_sizes_doc,
             "file_sizes(paths, free_space_of) -> ([(st_size, st_blocks) or None, ...], free)\n\n"
             "lstat each path (bytes) and statvfs free_space_of (bytes, or None) in one call\n"
             "without the GIL: each file's size and 512-byte blocks, None where it does not\n"
             "exist; free is the bytes free to unprivileged users of free_space_of's file\n"
             "system (f_bavail * f_frsize), None without one. Any other error raises OSError.\n"
             "A disk store's reservation measures the index files and the free space this way.");

static PyObject *file_sizes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg, *space_arg, *paths = NULL, *out = NULL, *sizes = NULL;
    Py_ssize_t count = 0;
    if (!PyArg_ParseTuple(args, "OO", &arg, &space_arg))
        return NULL;
    const char **names = path_names(arg, &paths, &count);
    struct stat *found = PyMem_Calloc(count ? (size_t)count : 1, sizeof *found);
    int *failed = PyMem_Calloc(count ? (size_t)count : 1, sizeof *failed);
    const char *space_of = NULL;
    if (names == NULL)
        goto done;
    if (found == NULL || failed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (space_arg != Py_None && (space_of = PyBytes_AsString(space_arg)) == NULL)
        goto done;
    struct statvfs space;
    int space_failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        failed[i] = lstat(names[i], &found[i]) == 0 ? 0 : errno;
    if (space_of != NULL)
        space_failed = statvfs(space_of, &space) == 0 ? 0 : errno;
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        if (failed[i] != 0 && failed[i] != ENOENT) {
            errno = failed[i];
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, names[i]);
            goto done;
        }
    }
    if (space_failed != 0) {
        errno = space_failed;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, space_of);
        goto done;
    }
    if ((sizes = size_list(found, failed, count)) == NULL) /* ENOENT: None */
        goto done;
    if (space_of == NULL)
        out = Py_BuildValue("(OO)", sizes, Py_None);
    else
        out = Py_BuildValue("(OK)", sizes,
                            (unsigned long long)space.f_bavail * (unsigned long long)space.f_frsize);
done:
    Py_XDECREF(sizes);
    PyMem_Free(found);
    PyMem_Free(failed);
    PyMem_Free(names);
    Py_XDECREF(paths);
    return out;
}

PyDoc_STRVAR(unlink_files_doc,
             "unlink_files(paths) -> [errno, ...]\n\n"
             "unlink each path (bytes) in turn, in one call without the GIL: per path 0 once it\n"
             "is gone (ENOENT: it was already), else the errno that kept it (a folder, a\n"
             "read-only folder, EIO). The disk store's trash removes a batch's evicted files\n"
             "this way.");

static PyObject *unlink_files(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg, *paths = NULL, *out = NULL;
    Py_ssize_t count = 0;
    if (!PyArg_ParseTuple(args, "O", &arg))
        return NULL;
    const char **names = path_names(arg, &paths, &count);
    int *errors = PyMem_Calloc(count ? (size_t)count : 1, sizeof *errors);
    if (names == NULL)
        goto done;
    if (errors == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        errors[i] = unlink(names[i]) == 0 || errno == ENOENT ? 0 : errno;
    Py_END_ALLOW_THREADS
    out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *item = PyLong_FromLong(errors[i]);
        if (item == NULL || PyList_SetItem(out, i, item) != 0)
            Py_CLEAR(out);
    }
done:
    PyMem_Free(errors);
    PyMem_Free(names);
    Py_XDECREF(paths);
    return out;
}

struct subfolder {
    char *name;
    long long size;
    long long blocks;
};

PyDoc_STRVAR(subfolder_sizes_doc,
             "subfolder_sizes(path) -> [(name, st_size, st_blocks), ...] or None\n\n"
             "Every folder directly in path (bytes; symbolic links not followed) with its size\n"
             "and 512-byte blocks, listed and measured in one call without the GIL; None when\n"
             "path cannot be listed.");

static PyObject *subfolder_sizes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path))
        return NULL;
    const char *folder = PyBytes_AsString(path);
    struct subfolder *found = NULL;
    size_t count = 0, room = 0;
    int listed = 0, no_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    DIR *dir = opendir(folder);
    if (dir != NULL) {
        listed = 1;
        int fd = dirfd(dir);
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
                continue;
            if (entry->d_type != DT_DIR && entry->d_type != DT_UNKNOWN)
                continue;
            struct stat st;
            if (fstatat(fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
                continue;
            if (count == room) {
                size_t grown = room ? 2 * room : 64;
                struct subfolder *more = realloc(found, grown * sizeof *found);
                if (more == NULL) {
                    no_memory = 1;
                    break;
                }
                found = more;
                room = grown;
            }
            char *name = strdup(entry->d_name);
            if (name == NULL) {
                no_memory = 1;
                break;
            }
            found[count].name = name;
            found[count].size = (long long)st.st_size;
            found[count].blocks = (long long)st.st_blocks;
            count++;
        }
        closedir(dir);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    PyObject *out = NULL;
    if (no_memory) {
        PyErr_NoMemory();
    } else if (!listed) {
        out = (Py_INCREF(Py_None), Py_None);
    } else {
        out = PyList_New((Py_ssize_t)count);
        for (size_t i = 0; out != NULL && i < count; i++) {
            PyObject *item = Py_BuildValue("yLL", found[i].name, found[i].size, found[i].blocks);
            if (item == NULL || PyList_SetItem(out, (Py_ssize_t)i, item) != 0)
                Py_CLEAR(out);
        }
    }
    for (size_t i = 0; i < count; i++)
        free(found[i].name);
    free(found);
    return out;
}

static PyMethodDef methods[] = {
    {"write_records", write_records, METH_VARARGS, write_records_doc},
    {"folder_sizes", folder_sizes, METH_VARARGS, folder_sizes_doc},
    {"file_sizes", file_sizes, METH_VARARGS, file_sizes_doc},
    {"unlink_files", unlink_files, METH_VARARGS, unlink_files_doc},
    {"subfolder_sizes", subfolder_sizes, METH_VARARGS, subfolder_sizes_doc},
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
