/* Record files written and published in one GIL-free call: open, write, close, rename.
 *
 * Why: the Python write path (RecordWriter.write_temp, then publish) leaves the GIL for each
 * of os.open, os.fchmod, os.pwritev, os.close and os.rename. While another thread runs Python
 * (an engine's scheduler and model loop), every return waits for the GIL, and each hand-over
 * stalls that thread too: beside an engine-like loop, the put's GIL hand-overs, not its CPU
 * time, were what the loop lost (docs/bench/2026-12-07-cpu-write-cost.md). This call gives
 * the GIL up once for a whole batch of records.
 *
 * It makes the same system calls, in the same order, as the Python path, so a crash leaves
 * what that path leaves: a temp file (removed by recovery) or a published record.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "recordwrite.h"

#define FILE_MODE 0600

static void fail(struct kvtier_write_result *result, int status, int error) {
    result->status = status;
    result->error = error;
}

/* Write both buffers from offset 0 until done: 0 on success, else errno. */
static int write_all(int fd, const void *header, size_t header_len, const void *payload,
                     size_t payload_len) {
    struct iovec parts[2] = {{(void *)header, header_len}, {(void *)payload, payload_len}};
    struct iovec *iov = parts;
    int count = 2;
    off_t offset = 0;
    while (count > 0) {
        ssize_t n = pwritev(fd, iov, count, offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return EIO; /* no progress: as RecordWriter.write_file */
        offset += n;
        size_t left = (size_t)n;
        while (count > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

void kvtier_write_record(const char *temp, const char *final, const void *header,
                         size_t header_len, const void *payload, size_t payload_len, int direct,
                         int datasync, int drop_pages, struct kvtier_write_result *result) {
    fail(result, KVTIER_WRITE_OK, 0);
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (direct ? O_DIRECT : 0);
    int fd = open(temp, flags, FILE_MODE);
    if (fd < 0) {
        int error = errno;
        if (direct && error == EINVAL) {
            unlink(temp); /* the file may be created before O_DIRECT is refused */
            fail(result, KVTIER_WRITE_DIRECT_REFUSED, error);
        } else {
            fail(result, KVTIER_WRITE_ERRNO, error);
        }
        return;
    }
    int error = fchmod(fd, FILE_MODE) == 0 ? 0 : errno;
    if (!error)
        error = write_all(fd, header, header_len, payload, payload_len);
    if (!error && datasync && fdatasync(fd) != 0)
        error = errno;
    if (!error && !direct && drop_pages)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* starts write-back of dirty pages */
    if (close(fd) != 0 && !error && errno != EINTR)
        error = errno;
    if (error) {
        unlink(temp);
        fail(result, direct && error == EINVAL ? KVTIER_WRITE_DIRECT_REFUSED : KVTIER_WRITE_ERRNO,
             error);
        return;
    }
    if (rename(temp, final) != 0) {
        error = errno;
        if (error == ENOENT) {
            fail(result, KVTIER_WRITE_NO_FOLDER, error);
            return;
        }
        unlink(temp);
        fail(result, KVTIER_WRITE_ERRNO, error);
    }
}
