/* One record file read in one GIL-free call: open, checks, read, close and payload checksum.
 *
 * Why: the Python read path (RecordIO.read_into, then the payload checksum) leaves the GIL for
 * each of os.open, os.fstat, os.preadv, os.close and the xxhash call. While another thread runs
 * Python (an engine's scheduler and model loop), every return waits for the GIL, up to the
 * interpreter's switch interval (5 ms) each time, so beside a busy Python thread the Python
 * path loses most of its speed where a plain preadv loses little (docs/benchmarks.md, "The
 * disk tier's read path beside a busy Python thread"). This call gives the GIL up once per
 * block.
 *
 * It makes the same checks, in the same order, as RecordIO.read_into; the header itself is then
 * decoded in Python (kvtier.format.record.decode_header), which holds the GIL only briefly.
 *
 * A read asked to be direct first asks the kernel whether the page cache holds the whole file
 * (kvtier_resident). Records are written O_DIRECT and so are normally not cached, but when they
 * are (the file system refused O_DIRECT writes, an unaligned buffered write, an operator copied
 * or read the folder, a tmpfs-like file system), an O_DIRECT read would fetch them from the
 * device again, far slower than a copy from memory. The probe reads no data: cachestat(2), or
 * mincore(2) on a mapping of the file where the kernel predates cachestat. Rejected: a
 * preadv2(RWF_NOWAIT) buffered attempt, which on a miss still starts read-ahead, so a cold
 * record would be read twice (once into the page cache, once O_DIRECT).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "recordread.h"
#include "xxh3.h"

/* cachestat(2) (Linux >= 6.5) has number 451 on x86-64 and arm64 alike; its structs are
 * declared here, named apart, as libc headers may not have them yet. */
#if defined(__x86_64__) || defined(__aarch64__)
#define KVTIER_NR_CACHESTAT 451
#endif

struct kvtier_cachestat_range {
    uint64_t off;
    uint64_t len;
};

struct kvtier_cachestat {
    uint64_t nr_cache;
    uint64_t nr_dirty;
    uint64_t nr_writeback;
    uint64_t nr_evicted;
    uint64_t nr_recently_evicted;
};

/* Set once cachestat answered ENOSYS (an older kernel), so the failed call is paid once per
 * process. Read and written without the GIL by every reader thread: relaxed atomics. */
static int cachestat_missing;
/* Tests only (kvtier_force_mincore): probe with mincore even where cachestat works. */
static int mincore_forced;

#ifdef KVTIER_NR_CACHESTAT
/* 1 or 0 as kvtier_resident, or -1 when the kernel has no cachestat. */
static int resident_cachestat(int fd, uint64_t size, uint64_t page) {
    struct kvtier_cachestat_range range = {0, size};
    struct kvtier_cachestat found;
    if (syscall(KVTIER_NR_CACHESTAT, fd, &range, &found, 0) != 0)
        return errno == ENOSYS ? -1 : 0; /* EPERM, EOPNOTSUPP...: cannot tell, so not held */
    return found.nr_cache >= (size + page - 1) / page;
}
#endif

static int resident_mincore(int fd, uint64_t size, uint64_t page) {
    if (size > SIZE_MAX)
        return 0;
    /* Mapping a file faults nothing in, and mincore only looks at the page cache. */
    uint8_t *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return 0;
    uint64_t pages = (size + page - 1) / page;
    unsigned char vec[256];
    int all = 1;
    for (uint64_t first = 0; first < pages && all; first += sizeof vec) {
        size_t count = pages - first < sizeof vec ? (size_t)(pages - first) : sizeof vec;
        if (mincore(map + first * page, count * page, vec) != 0) {
            all = 0;
            break;
        }
        for (size_t i = 0; i < count; i++) {
            if (!(vec[i] & 1)) {
                all = 0;
                break;
            }
        }
    }
    munmap(map, (size_t)size);
    return all;
}

int kvtier_resident(int fd, uint64_t size) {
    if (size == 0)
        return 1;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
#ifdef KVTIER_NR_CACHESTAT
    if (!__atomic_load_n(&mincore_forced, __ATOMIC_RELAXED) &&
        !__atomic_load_n(&cachestat_missing, __ATOMIC_RELAXED)) {
        int found = resident_cachestat(fd, size, page);
        if (found >= 0)
            return found;
        __atomic_store_n(&cachestat_missing, 1, __ATOMIC_RELAXED);
    }
#endif
    return resident_mincore(fd, size, page);
}

const char *kvtier_residency_probe(void) {
#ifdef KVTIER_NR_CACHESTAT
    if (__atomic_load_n(&mincore_forced, __ATOMIC_RELAXED))
        return "mincore";
    if (!__atomic_load_n(&cachestat_missing, __ATOMIC_RELAXED)) {
        /* No file at hand: a kernel with cachestat answers EBADF for fd -1, one without ENOSYS. */
        struct kvtier_cachestat_range range = {0, 0};
        struct kvtier_cachestat found;
        if (syscall(KVTIER_NR_CACHESTAT, -1, &range, &found, 0) == 0 || errno != ENOSYS)
            return "cachestat";
        __atomic_store_n(&cachestat_missing, 1, __ATOMIC_RELAXED);
    }
#endif
    return "mincore";
}

void kvtier_force_mincore(int force) {
    __atomic_store_n(&mincore_forced, force != 0, __ATOMIC_RELAXED);
}

/* Opened without O_DIRECT: whether to read direct is known only once the page cache has been
 * asked, and then F_SETFL turns it on (one call, as an open with O_DIRECT would have cost). */
static int open_record(const char *path) {
    /* O_NONBLOCK: a FIFO planted in place of a record must not hang the reader. */
    int fd;
    do {
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/* preadv, or with nowait preadv2(RWF_NOWAIT), of the count parts at off until all are full or
 * the file ends: the bytes read, or -1 with errno (with nowait, EAGAIN: a page is not in the
 * page cache; EOPNOTSUPP: the kernel or file system has no RWF_NOWAIT). Advances parts. */
static ssize_t read_parts(int fd, struct iovec *parts, int count, off_t off, int nowait) {
#ifndef RWF_NOWAIT
    if (nowait) {
        errno = EOPNOTSUPP;
        return -1;
    }
#endif
    size_t done = 0;
    while (count > 0) {
        ssize_t n;
#ifdef RWF_NOWAIT
        n = nowait ? preadv2(fd, parts, count, off + (off_t)done, RWF_NOWAIT)
                   : preadv(fd, parts, count, off + (off_t)done);
#else
        n = preadv(fd, parts, count, off + (off_t)done);
#endif
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        done += (size_t)n;
        for (size_t left = (size_t)n; count > 0 && left > 0;) {
            size_t took = left < parts->iov_len ? left : parts->iov_len;
            parts->iov_base = (uint8_t *)parts->iov_base + took;
            parts->iov_len -= took;
            left -= took;
            if (parts->iov_len == 0) {
                parts++;
                count--;
            }
        }
    }
    return (ssize_t)done;
}

/* read_parts of one buffer. */
static ssize_t read_span(int fd, uint8_t *buf, size_t len, off_t off, int nowait) {
    struct iovec part = {buf, len};
    return read_parts(fd, &part, 1, off, nowait);
}

static void fail(struct kvtier_read_result *result, int status, int error) {
    result->status = status;
    result->error = error;
}

/* The checks every read makes before reading, in RecordIO.read_into's order: 0 when fd is a
 * regular file of this user that others cannot write, of exactly total bytes; else -1 with the
 * result's status set. */
static int check_open_file(int fd, uint64_t total, struct kvtier_read_result *result) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(result, KVTIER_READ_ERRNO, errno);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        result->detail = st.st_mode;
        fail(result, KVTIER_READ_NOT_REGULAR, 0);
        return -1;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        /* Another user's file, or one others could have rewritten, may carry a valid checksum
         * over KV it wants served. */
        result->detail = st.st_uid;
        result->detail2 = st.st_mode;
        fail(result, KVTIER_READ_NOT_PRIVATE, 0);
        return -1;
    }
    if ((uint64_t)st.st_size != total) {
        result->detail = (uint64_t)st.st_size;
        fail(result, KVTIER_READ_LENGTH, 0);
        return -1;
    }
    return 0;
}

/* Each reader thread's staging buffer for buffered reads: one chunk, reused for every chunk of
 * every record, so it stays in the CPU cache. Freed when the thread ends. */
static pthread_key_t staging_key;
static pthread_once_t staging_once = PTHREAD_ONCE_INIT;
static int staging_key_made;

static void make_staging_key(void) { staging_key_made = pthread_key_create(&staging_key, free) == 0; }

static uint8_t *staging_buffer(void) {
    pthread_once(&staging_once, make_staging_key);
    if (!staging_key_made)
        return NULL;
    uint8_t *buffer = pthread_getspecific(staging_key);
    if (buffer == NULL) {
        void *fresh;
        if (posix_memalign(&fresh, 4096, KVTIER_RESIDENT_CHUNK) != 0)
            return NULL;
        if (pthread_setspecific(staging_key, fresh) != 0) {
            free(fresh);
            return NULL;
        }
        buffer = fresh;
    }
    return buffer;
}

/* A buffered read of the header, then of the payload in chunks. Hashed payloads go through the
 * thread's staging buffer: the kernel copies each chunk from the page cache into it (it stays
 * in the CPU cache), and one pass hashes it and streams it into the payload. The payload is
 * then written once and read never, as a memcpy with streaming stores does; a read straight
 * into the payload followed by a hash would cross memory twice more. */
static void read_buffered_hashing(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                                  size_t payload_len, int checksum, int nowait,
                                  struct kvtier_read_result *result) {
    ssize_t got = read_span(fd, header, header_len, 0, nowait);
    int hashing = checksum && got == (ssize_t)header_len &&
                  kvtier_record_hashes_payload(header, header_len, payload_len);
    struct kvtier_xxh3_stream stream;
    if (hashing)
        kvtier_xxh3_stream_init(&stream);
    uint8_t *staging = hashing ? staging_buffer() : NULL;
    size_t done = 0;
    while (got == (ssize_t)(header_len + done) && done < payload_len) {
        /* Chunks only where a chunk is hashed while cached; otherwise the rest in one read. */
        size_t chunk = hashing ? KVTIER_RESIDENT_CHUNK : payload_len - done;
        size_t len = payload_len - done < chunk ? payload_len - done : chunk;
        ssize_t n = read_span(fd, staging != NULL ? staging : payload + done, len,
                              (off_t)(header_len + done), nowait);
        if (n < 0) {
            got = -1;
            break;
        }
        if (staging != NULL)
            kvtier_xxh3_stream_copy(&stream, payload, staging, done, (size_t)n, payload_len);
        else if (hashing)
            kvtier_xxh3_stream_update(&stream, payload, done + (size_t)n, payload_len);
        done += (size_t)n;
        got = (ssize_t)(header_len + done);
        if ((size_t)n < len)
            break; /* the file ended early: the caller sees a short read */
    }
    if (got < 0) {
        if (nowait && (errno == EAGAIN || errno == EOPNOTSUPP)) {
            result->nowait_refused = errno == EOPNOTSUPP;
            fail(result, KVTIER_READ_NOT_RESIDENT, errno);
        } else {
            fail(result, KVTIER_READ_ERRNO, errno);
        }
        return;
    }
    result->status = KVTIER_READ_OK;
    result->detail = (uint64_t)got;
    if (hashing && done == payload_len) {
        result->payload_checksum = kvtier_xxh3_stream_digest(&stream, payload, payload_len);
        result->checksummed = 1;
    }
}

/* After check_open_file: the read as kvtier_read_record makes it. */
static void read_checked_file(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                              size_t payload_len, int direct, int checksum, int page_cache,
                              struct kvtier_read_result *result) {
    if (direct) {
        /* After the checks: the kernel answers for this user's files only (kvtier_resident). */
        if (page_cache && kvtier_resident(fd, (uint64_t)header_len + payload_len)) {
            /* A page evicted from here on only makes this read slower, never wrong. */
            result->from_page_cache = 1;
            direct = 0;
        } else if (fcntl(fd, F_SETFL, O_NONBLOCK | O_DIRECT) != 0) {
            /* F_SETFL sets the status flags whole: O_NONBLOCK is kept, as open_record set it. */
            if (errno != EINVAL) {
                fail(result, KVTIER_READ_ERRNO, errno);
                return;
            }
            /* The file system has no O_DIRECT (a regular file, checked above): read buffered,
             * and the caller stops asking. */
            result->direct_refused = 1;
            direct = 0;
        }
    }
    if (!direct) {
        read_buffered_hashing(fd, header, header_len, payload, payload_len, checksum, 0, result);
        return;
    }
    /* O_DIRECT: one request for the whole record keeps the device's queue full. */
    struct iovec parts[2] = {{header, header_len}, {payload, payload_len}};
    ssize_t got = read_parts(fd, parts, 2, 0, 0);
    if (got < 0 && errno == EINVAL) {
        /* The file system took O_DIRECT and refused the read: read it buffered. */
        result->direct_refused = 1;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) < 0) {
            fail(result, KVTIER_READ_ERRNO, errno);
            return;
        }
        read_buffered_hashing(fd, header, header_len, payload, payload_len, checksum, 0, result);
        return;
    }
    if (got < 0) {
        fail(result, KVTIER_READ_ERRNO, errno);
        return;
    }
    result->status = KVTIER_READ_OK;
    result->detail = (uint64_t)got;
    if (checksum && (size_t)got == header_len + payload_len &&
        kvtier_record_hashes_payload(header, header_len, payload_len)) {
        result->payload_checksum = kvtier_xxh3_64_long(payload, payload_len);
        result->checksummed = 1;
    }
}

int kvtier_path_resident(const char *path) {
    int fd = open_record(path);
    if (fd < 0)
        return -errno;
    struct stat st;
    int found = fstat(fd, &st) == 0 ? kvtier_resident(fd, (uint64_t)st.st_size) : -errno;
    close(fd);
    return found;
}

/* open_record and check_open_file: the checked descriptor, or -1 with result's status set. */
static int open_checked(const char *path, uint64_t size, struct kvtier_read_result *result) {
    *result = (struct kvtier_read_result){0};
    int fd = open_record(path);
    if (fd < 0) {
        fail(result, errno == ELOOP ? KVTIER_READ_SYMLINK : KVTIER_READ_ERRNO, errno);
        return -1;
    }
    if (check_open_file(fd, size, result) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void kvtier_read_record(const char *path, uint8_t *header, size_t header_len, uint8_t *payload,
                        size_t payload_len, int direct, int checksum, int page_cache,
                        struct kvtier_read_result *result) {
    int fd = open_checked(path, (uint64_t)header_len + payload_len, result);
    if (fd < 0)
        return;
    read_checked_file(fd, header, header_len, payload, payload_len, direct, checksum, page_cache,
                      result);
    close(fd);
}

int kvtier_read_unless_resident(const char *path, uint8_t *header, size_t header_len,
                                uint8_t *payload, size_t payload_len, int direct, int checksum,
                                struct kvtier_read_result *result) {
    uint64_t size = (uint64_t)header_len + payload_len;
    int fd = open_checked(path, size, result);
    if (fd < 0)
        return -1;
    if (kvtier_resident(fd, size)) {
        result->from_page_cache = 1;
        return fd;
    }
    read_checked_file(fd, header, header_len, payload, payload_len, direct, checksum, 0, result);
    close(fd);
    return -1;
}

void kvtier_read_resident(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                          size_t payload_len, int checksum, struct kvtier_read_result *result) {
    *result = (struct kvtier_read_result){0};
    result->from_page_cache = 1;
    /* No read-ahead from this descriptor: a cached page marked for it would otherwise start
     * reading pages evicted since the probe, device I/O on behalf of a read that must never
     * cause any, and could turn a miss into a hit depending on timing. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    read_buffered_hashing(fd, header, header_len, payload, payload_len, checksum, 1, result);
    close(fd);
}

int kvtier_read_claiming(const char *path, uint8_t *header, size_t header_len, uint8_t *bounce,
                         uint8_t *out, size_t payload_len, int32_t *cell, int direct,
                         int checksum, struct kvtier_read_result *result) {
    int fd = kvtier_read_unless_resident(path, header, header_len, bounce, payload_len, direct,
                                         checksum, result);
    if (fd < 0) {
        /* Read into bounce, unclaimed, since that read may wait for the device. A whole record
         * is claimed and copied here too: one call per block either way. */
        if (result->status != KVTIER_READ_OK || result->detail != header_len + payload_len)
            return KVTIER_INTO_BOUNCE;
        if (!kvtier_claim_move(cell, KVTIER_CLAIM_PENDING, KVTIER_CLAIM_COPYING))
            return KVTIER_READ_NOT_CLAIMED;
        memcpy(out, bounce, payload_len);
        kvtier_claim_move(cell, KVTIER_CLAIM_COPYING, KVTIER_CLAIM_WRITTEN);
        return KVTIER_COPIED_INTO_OUT;
    }
    if (!kvtier_claim_move(cell, KVTIER_CLAIM_PENDING, KVTIER_CLAIM_COPYING)) {
        close(fd);
        return KVTIER_ABANDONED;
    }
    kvtier_read_resident(fd, header, header_len, out, payload_len, checksum, result);
    kvtier_claim_move(cell, KVTIER_CLAIM_COPYING, KVTIER_CLAIM_WRITTEN);
    return KVTIER_INTO_OUT;
}
