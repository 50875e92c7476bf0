/* One record file read in one call, for kvtier's disk tier (kvtier.store.disk.io.RecordIO). */
#ifndef KVTIER_RECORDREAD_H
#define KVTIER_RECORDREAD_H

#include <stddef.h>
#include <stdint.h>

/* What kvtier_read_record found; kvtier.store.disk.io maps each to the Python path's error. */
enum kvtier_read_status {
    KVTIER_READ_OK = 0,          /* read; detail = bytes read (the caller checks the length) */
    KVTIER_READ_ERRNO = 1,       /* an OS error: error holds errno */
    KVTIER_READ_SYMLINK = 2,     /* the path is a symlink (never followed) */
    KVTIER_READ_NOT_REGULAR = 3, /* detail = st_mode */
    KVTIER_READ_NOT_PRIVATE = 4, /* detail = st_uid, detail2 = st_mode */
    KVTIER_READ_LENGTH = 5,      /* the file's size is not header + payload: detail = st_size */
};

struct kvtier_read_result {
    int status;
    int error;
    uint64_t detail;
    uint64_t detail2;
    /* O_DIRECT was asked for and refused on a regular file: the caller stops asking. */
    int direct_refused;
    /* The payload's XXH3-64 was computed (checksum asked, little-endian host, the header names
     * XXH3-64, the payload is long enough): payload_checksum holds it. */
    int checksummed;
    uint64_t payload_checksum;
    /* direct was asked, yet the page cache held every page of the file, so it was read
     * buffered: a memory copy instead of a device read. 0 for every read made O_DIRECT, and
     * for reads not asked to be direct (never probed). */
    int from_page_cache;
};

/* Open path (no symlinks, no blocking on a FIFO), check it is a regular file of this user that
 * others cannot write, of exactly header_len + payload_len bytes, read the header into header
 * and the rest into payload, close it, and when asked hash the payload. With direct, O_DIRECT
 * where the file system allows it, unless page_cache is set and the page cache holds the whole
 * file (kvtier_resident): then buffered. Touches no Python object: call it without the GIL. */
void kvtier_read_record(const char *path, uint8_t *header, size_t header_len, uint8_t *payload,
                        size_t payload_len, int direct, int checksum, int page_cache,
                        struct kvtier_read_result *result);

/* 1 when the page cache holds every page of the first size bytes of fd, 0 when some page is
 * missing or the kernel cannot say (never triggers I/O or read-ahead). The file must be the
 * caller's own: the kernel answers for no other (cachestat refuses, mincore reports every page
 * resident). */
int kvtier_resident(int fd, uint64_t size);

/* kvtier_resident of the file at path, opened as kvtier_read_record opens a record (no
 * symlinks, no blocking on a FIFO); -errno when it cannot be opened or stat'ed. */
int kvtier_path_resident(const char *path);

/* Which probe kvtier_resident uses in this process: "cachestat" or "mincore". */
const char *kvtier_residency_probe(void);

/* Tests only: with force set, kvtier_resident uses mincore as where cachestat is missing. */
void kvtier_force_mincore(int force);

#endif
