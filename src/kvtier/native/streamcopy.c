/* Batched page copies with non-temporal stores (kvtier's host pool <-> engine KV copies).
 *
 * Why: a restore moves hundreds of MB as ~200 KB pages. glibc copies pages of that size with
 * ordinary stores, which first read every destination line into the cache (read for
 * ownership) and then evict it again: on the machine this was written on that ran at half
 * the speed of one large memcpy, which glibc does with streaming stores. Streaming stores
 * write straight to memory. Destinations never overlap sources (different buffers).
 *
 * SSE2 only (the x86-64 baseline), so the library runs on every x86-64 CPU. Elsewhere the build
 * stops here on purpose: setup.py marks the extension optional, so the install goes on without it
 * and kvtier keeps its memmove path.
 */
#if !defined(__x86_64__) && !defined(_M_X64)
#error "kvtier's streaming page copier needs x86-64 (SSE2 streaming stores)"
#endif

#include <emmintrin.h>
#include <stddef.h>
#include <string.h>

#include "streamcopy.h"

/* Below this a copy stays in the cache: streaming it would cost a later read. */
#define STREAM_MIN 4096

static void stream_one(char *d, const char *s, size_t len) {
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    size_t lines = len / 64;
    for (size_t i = 0; i < lines; i++) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
        s += 64;
        d += 64;
    }
    memcpy(d, s, len % 64);
}

uint64_t kvtier_copy_pages(uint64_t n, const uint64_t *dst, const uint64_t *src,
                           const uint64_t *sizes) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        char *d = (char *)(uintptr_t)dst[i];
        const char *s = (const char *)(uintptr_t)src[i];
        if (sizes[i] < STREAM_MIN)
            memcpy(d, s, sizes[i]);
        else
            stream_one(d, s, sizes[i]);
        total += sizes[i];
    }
    _mm_sfence(); /* streaming stores are weakly ordered: publish them before returning */
    return total;
}
