/* The page copy kernel shared by streamcopy.c and its Python binding, streamcopy_module.c. */
#ifndef KVTIER_STREAMCOPY_H
#define KVTIER_STREAMCOPY_H

#include <stdint.h>

/* dst[i] <- src[i], sizes[i] bytes, for i < n; returns the number of bytes copied.
 * Destinations must not overlap sources. Safe to call without the GIL: it touches no Python
 * object. */
uint64_t kvtier_copy_pages(uint64_t n, const uint64_t *dst, const uint64_t *src,
                           const uint64_t *sizes);

#endif
