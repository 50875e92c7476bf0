/* One record file read in one GIL-free call: open, checks, read, close and payload checksum.
 *
 * Why: the Python read path (RecordIO.read_into, then the payload checksum) leaves the GIL for
 * each of os.open, os.fstat, os.preadv, os.close and the xxhash call. While another thread runs
 * Python (an engine's scheduler and model loop), every return waits for the GIL, up to the
 * interpreter's switch interval (5 ms) each time: measured with a busy Python thread beside four
 * readers, kvtier's store read fell from 0.61 to 0.13 GB/s where plain preadv reads fell from
 * 0.61 to 0.49 (docs/benchmarks.md). This call gives the GIL up once per block.
 *
 * It makes the same checks, in the same order, as RecordIO.read_into; the header itself is then
 * decoded in Python (kvtier.format.record.decode_header), which holds the GIL only briefly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "recordread.h"
#include "xxh3.h"

/* kvtier.format.record: byte 12 of the header is the payload checksum's algorithm id, and
 * XXH3-64 is id 1 (kvtier.format.checksum). */
#define HEADER_CHECKSUM_ALG_OFFSET 12
#define CHECKSUM_XXH3_64 1

static int open_record(const char *path, int direct) {
    /* O_NONBLOCK: a FIFO planted in place of a record must not hang the reader. */
    int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (direct ? O_DIRECT : 0);
    int fd;
    do {
        fd = open(path, flags);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/* preadv of header then payload from offset 0 until both are full or the file ends; the bytes
 * read, or -1 with errno. */
static ssize_t read_all(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                        size_t payload_len) {
    size_t done = 0, total = header_len + payload_len;
    while (done < total) {
        struct iovec parts[2];
        int count = 0;
        if (done < header_len) {
            parts[count].iov_base = header + done;
            parts[count++].iov_len = header_len - done;
            parts[count].iov_base = payload;
            parts[count++].iov_len = payload_len;
        } else {
            parts[count].iov_base = payload + (done - header_len);
            parts[count++].iov_len = total - done;
        }
        ssize_t n = preadv(fd, parts, count, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static void fail(struct kvtier_read_result *result, int status, int error) {
    result->status = status;
    result->error = error;
}

static void read_open_file(int fd, uint8_t *header, size_t header_len, uint8_t *payload,
                           size_t payload_len, int direct, int checksum,
                           struct kvtier_read_result *result) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(result, KVTIER_READ_ERRNO, errno);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        result->detail = st.st_mode;
        fail(result, KVTIER_READ_NOT_REGULAR, 0);
        return;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        /* Another user's file, or one others could have rewritten, may carry a valid checksum
         * over KV it wants served. */
        result->detail = st.st_uid;
        result->detail2 = st.st_mode;
        fail(result, KVTIER_READ_NOT_PRIVATE, 0);
        return;
    }
    if ((uint64_t)st.st_size != (uint64_t)header_len + payload_len) {
        result->detail = (uint64_t)st.st_size;
        fail(result, KVTIER_READ_LENGTH, 0);
        return;
    }
    ssize_t got = read_all(fd, header, header_len, payload, payload_len);
    if (got < 0 && errno == EINVAL && direct) {
        /* The file system took O_DIRECT at open and refused the read: read it buffered. */
        result->direct_refused = 1;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) < 0) {
            fail(result, KVTIER_READ_ERRNO, errno);
            return;
        }
        got = read_all(fd, header, header_len, payload, payload_len);
    }
    if (got < 0) {
        fail(result, KVTIER_READ_ERRNO, errno);
        return;
    }
    result->status = KVTIER_READ_OK;
    result->detail = (uint64_t)got;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (checksum && (size_t)got == header_len + payload_len &&
        header_len > HEADER_CHECKSUM_ALG_OFFSET &&
        header[HEADER_CHECKSUM_ALG_OFFSET] == CHECKSUM_XXH3_64 &&
        payload_len >= KVTIER_XXH3_LONG_MIN) {
        result->payload_checksum = kvtier_xxh3_64_long(payload, payload_len);
        result->checksummed = 1;
    }
#else
    (void)checksum;
#endif
}

void kvtier_read_record(const char *path, uint8_t *header, size_t header_len, uint8_t *payload,
                        size_t payload_len, int direct, int checksum,
                        struct kvtier_read_result *result) {
    *result = (struct kvtier_read_result){0};
    int fd = open_record(path, direct);
    if (fd < 0 && errno == EINVAL && direct) {
        /* O_DIRECT refused: by the file system, or because this is no regular file (a FIFO
         * planted in place of a record). Only the first turns it off for good. */
        fd = open_record(path, 0);
        if (fd >= 0) {
            struct stat st;
            result->direct_refused = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
        }
        direct = 0;
    }
    if (fd < 0) {
        fail(result, errno == ELOOP ? KVTIER_READ_SYMLINK : KVTIER_READ_ERRNO, errno);
        return;
    }
    read_open_file(fd, header, header_len, payload, payload_len, direct, checksum, result);
    close(fd);
}
