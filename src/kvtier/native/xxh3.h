/* XXH3-64 (seed 0, default secret) of inputs longer than 240 bytes: the payload checksum of a
 * kvtier record (kvtier.format.checksum, algorithm id 1), computed next to the read that brought
 * the payload in, so a block's load needs no second trip through the GIL. */
#ifndef KVTIER_XXH3_H
#define KVTIER_XXH3_H

#include <stddef.h>
#include <stdint.h>

/* Shortest input kvtier_xxh3_64_long hashes; shorter inputs take other branches of XXH3, which
 * kvtier leaves to the xxhash package (they are header-sized and cheap to hash under the GIL). */
#define KVTIER_XXH3_LONG_MIN 241

/* XXH3-64 of len >= KVTIER_XXH3_LONG_MIN bytes; equals xxhash.xxh3_64_intdigest(data). */
uint64_t kvtier_xxh3_64_long(const uint8_t *data, size_t len);

/* The same hash of a buffer that fills from its start while it is hashed (a chunked read), so
 * each chunk is hashed while the CPU cache still holds it. The caller keeps the whole buffer:
 * the last block and stripe are hashed from it at the end. */
struct kvtier_xxh3_stream {
    uint64_t acc[8];
    size_t blocks_done;
};

void kvtier_xxh3_stream_init(struct kvtier_xxh3_stream *stream);

/* Hash the whole blocks of data[0, available) not hashed yet, short of the input's last block;
 * total (>= KVTIER_XXH3_LONG_MIN) is the input's final length. */
void kvtier_xxh3_stream_update(struct kvtier_xxh3_stream *stream, const uint8_t *data,
                               size_t available, size_t total);

/* Copy src[0, len) to dst + offset and hash it on the way, in one pass: each 64-byte stripe is
 * loaded once, hashed and written with streaming stores. dst is the whole input's buffer (total
 * bytes, filled up to offset); the input's last block is copied, not hashed (the digest hashes
 * it from dst). Chunks that do not start at the next block to hash are only copied, and the
 * digest catches up from dst: any sequence of chunks gives the right hash. */
void kvtier_xxh3_stream_copy(struct kvtier_xxh3_stream *stream, uint8_t *dst, const uint8_t *src,
                             size_t offset, size_t len, size_t total);

/* XXH3-64 of data[0, len), len the total given to every update: equals kvtier_xxh3_64_long. */
uint64_t kvtier_xxh3_stream_digest(struct kvtier_xxh3_stream *stream, const uint8_t *data,
                                   size_t len);

/* kvtier.format.record: byte 12 of a record's header is the payload checksum's algorithm id,
 * and XXH3-64 is id 1 (kvtier.format.checksum). */
#define KVTIER_HEADER_CHECKSUM_ALG_OFFSET 12
#define KVTIER_CHECKSUM_XXH3_64 1

/* Whether a record's header names the checksum computed here (little-endian hosts only), for a
 * payload long enough for kvtier_xxh3_64_long. */
static inline int kvtier_record_hashes_payload(const uint8_t *header, size_t header_len,
                                               size_t payload_len) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return header_len > KVTIER_HEADER_CHECKSUM_ALG_OFFSET &&
           header[KVTIER_HEADER_CHECKSUM_ALG_OFFSET] == KVTIER_CHECKSUM_XXH3_64 &&
           payload_len >= KVTIER_XXH3_LONG_MIN;
#else
    (void)header;
    (void)header_len;
    (void)payload_len;
    return 0;
#endif
}

#endif
