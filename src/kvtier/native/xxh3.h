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

#endif
