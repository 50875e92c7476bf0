/* Record files written and published in one call, for kvtier's disk tier
 * (kvtier.store.disk.writer.RecordWriter.write_records). */
#ifndef KVTIER_RECORDWRITE_H
#define KVTIER_RECORDWRITE_H

#include <stddef.h>

/* What kvtier_write_record did; kvtier.store.disk.writer maps each to the Python path's. */
enum kvtier_write_status {
    KVTIER_WRITE_OK = 0,             /* written and renamed to its final name */
    KVTIER_WRITE_ERRNO = 1,          /* an OS error (error holds errno); no temp file is left */
    KVTIER_WRITE_DIRECT_REFUSED = 2, /* O_DIRECT refused (EINVAL); no temp file is left */
    KVTIER_WRITE_NO_FOLDER = 3,      /* written, but the final name's folder is missing: the
                                      * temp file is left for the caller to publish */
};

struct kvtier_write_result {
    int status;
    int error;
};

/* Create temp (O_EXCL, no symlink, mode 0600 whatever the umask), write header then payload
 * from offset 0 until all is written, fdatasync when asked, drop the written pages when
 * buffered and asked, close, then rename temp to final. O_DIRECT when direct is set (the
 * caller checked the buffers' alignment). On any failure before the rename, and on a failed
 * rename other than a missing folder, temp is removed. Touches no Python object: call it
 * without the GIL. */
void kvtier_write_record(const char *temp, const char *final, const void *header,
                         size_t header_len, const void *payload, size_t payload_len, int direct,
                         int datasync, int drop_pages, struct kvtier_write_result *result);

#endif
