/* One record file read in one call, for kvtier's disk tier (kvtier.store.disk.io.RecordIO). */
#ifndef KVTIER_RECORDREAD_H
#define KVTIER_RECORDREAD_H

#include <stddef.h>
#include <stdint.h>

#include "claim.h"

/* What kvtier_read_record found; kvtier.store.disk.io maps each to the Python path's error. */
enum kvtier_read_status {
    KVTIER_READ_OK = 0,          /* read; detail = bytes read (the caller checks the length) */
    KVTIER_READ_ERRNO = 1,       /* an OS error: error holds errno */
    KVTIER_READ_SYMLINK = 2,     /* the path is a symlink (never followed) */
    KVTIER_READ_NOT_REGULAR = 3, /* detail = st_mode */
    KVTIER_READ_NOT_PRIVATE = 4, /* detail = st_uid, detail2 = st_mode */
    KVTIER_READ_LENGTH = 5,      /* the file's size is not header + payload: detail = st_size */
    KVTIER_READ_NOT_RESIDENT = 6, /* kvtier_read_resident: a page left the page cache during
                                   * the read, or the kernel has no RWF_NOWAIT (nowait_refused) */
};

/* Buffered reads read and hash a record in chunks of this size, each hashed while the CPU
 * cache still holds it (a fraction of one core's L2 cache). */
#ifndef KVTIER_RESIDENT_CHUNK /* a build may set it, to measure another size */
#define KVTIER_RESIDENT_CHUNK (256 * 1024)
#endif

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
    /* kvtier_read_resident: preadv2 refused RWF_NOWAIT (EOPNOTSUPP): the caller stops using it. */
    int nowait_refused;
};

/* Open path (no symlinks, no blocking on a FIFO), check it is a regular file of this user that
 * others cannot write, of exactly header_len + payload_len bytes, read the header into header
 * and the rest into payload, close it, and when asked hash the payload. With direct, O_DIRECT
 * where the file system allows it, unless page_cache is set and the page cache holds the whole
 * file (kvtier_resident): then buffered. Touches no Python object: call it without the GIL. */
void kvtier_read_record(const char *path, uint8_t *header, size_t header_len, uint8_t *payload,
                        size_t payload_len, int direct, int checksum, int page_cache,
                        struct kvtier_read_result *result);

/* The two halves of a read into a buffer that must not be written until its caller has
 * claimed it (kvtier.dataplane.abandonable): with the page cache holding the record, the read
 * goes straight into the caller's buffer instead of through a bounce buffer and a copy.
 *
 * kvtier_read_unless_resident opens path and makes kvtier_read_record's checks. When the page
 * cache holds the whole file it reads nothing and returns the open descriptor (status OK,
 * from_page_cache set): the caller claims its buffer, then calls kvtier_read_resident. Otherwise
 * it reads the record into header and payload (the bounce buffer) as kvtier_read_record does,
 * without probing again, and returns -1. One GIL-free call either way. */
int kvtier_read_unless_resident(const char *path, uint8_t *header, size_t header_len,
                                uint8_t *payload, size_t payload_len, int direct, int checksum,
                                struct kvtier_read_result *result);

/* kvtier_read_resident reads the header and payload of fd (from kvtier_read_unless_resident) with
 * RWF_NOWAIT, so the read never waits for the device: a page evicted since the probe ends it
 * with KVTIER_READ_NOT_RESIDENT, the payload partly written. Each chunk is hashed as it lands
 * (checksum and the header's algorithm as in kvtier_read_record). Closes fd. Call it without
 * the GIL. */
void kvtier_read_resident(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                          size_t payload_len, int checksum, struct kvtier_read_result *result);

/* Where kvtier_read_claiming put the record. */
enum kvtier_claimed_read {
    KVTIER_INTO_BOUNCE = 0,     /* the read failed or was short (result->status, detail) */
    KVTIER_INTO_OUT = 1,        /* resident: claimed, then read into out as kvtier_read_resident */
    KVTIER_ABANDONED = 2,       /* the load was no longer pending: out untouched */
    KVTIER_COPIED_INTO_OUT = 3, /* not resident: read into bounce, then claimed and copied */
    KVTIER_READ_NOT_CLAIMED = 4, /* not resident: read into bounce, but the load was no longer
                                  * pending: out untouched (the caller may still check bounce) */
};

/* kvtier_read_unless_resident, the claim on cell, then kvtier_read_resident into out (a record
 * the page cache holds) or a copy of bounce into out (any other, read there unclaimed since
 * that read may wait for the device): one call and one GIL hand-over per block, where a claim
 * made in Python costs two. Each hand-over can wait up to the interpreter's switch interval
 * while another thread runs Python (an engine's scheduler), so per block the count matters
 * more than the work. The payload is verified after the claim: a bad record leaves out
 * written and its load failed. Once it stops writing out, it moves the claim to WRITTEN. */
int kvtier_read_claiming(const char *path, uint8_t *header, size_t header_len, uint8_t *bounce,
                         uint8_t *out, size_t payload_len, int32_t *cell, int direct,
                         int checksum, struct kvtier_read_result *result);

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
