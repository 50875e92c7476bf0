/* XXH3-64 of long inputs, written from the published XXH3 specification (seed 0, the default
 * 192-byte secret), for the native record reader (recordread.c).
 *
 * Why here and not the xxhash package: the package releases the GIL for each large hash, and a
 * thread that gives the GIL up waits up to the interpreter's switch interval (5 ms) to get it
 * back while an engine thread runs Python. A record read that hashes its payload inside the
 * same GIL-free call pays that wait once per block instead of twice. Tests compare every result
 * with xxhash.xxh3_64_intdigest (tests/unit/test_native_reader.py).
 *
 * Little-endian only (x86-64, aarch64): recordread.c skips the checksum elsewhere and kvtier
 * hashes with the package. The accumulate and scramble steps use SSE2 on x86-64 (its baseline),
 * plain 64-bit arithmetic elsewhere.
 */
#include <string.h>

#include "xxh3.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define KVTIER_XXH3_SSE2 1
#endif

#define PRIME32_1 0x9E3779B1U
#define PRIME32_2 0x85EBCA77U
#define PRIME32_3 0xC2B2AE3DU
#define PRIME64_1 0x9E3779B185EBCA87ULL
#define PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define PRIME64_3 0x165667B19E3779F9ULL
#define PRIME64_4 0x85EBCA77C2B2AE63ULL
#define PRIME64_5 0x27D4EB2F165667C5ULL
#define PRIME_MX1 0x165667919E3779F9ULL

#define STRIPE_LEN 64
#define SECRET_SIZE 192
#define SECRET_CONSUME_RATE 8
#define STRIPES_PER_BLOCK ((SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE)
#define BLOCK_LEN (STRIPE_LEN * STRIPES_PER_BLOCK)
#define SECRET_LASTACC_START 7
#define SECRET_MERGEACCS_START 11

/* The specification's default secret. */
static const uint8_t SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v); /* little-endian hosts only (see the file comment) */
    return v;
}

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    unsigned __int128 product = (unsigned __int128)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= PRIME_MX1;
    return h ^ (h >> 32);
}

#ifdef KVTIER_XXH3_SSE2
typedef __m128i acc_t[4];

/* One accumulator of a stripe: 16 bytes of input and of the secret. */
static inline __m128i accumulate_lane(__m128i acc, __m128i data, const uint8_t *secret) {
    __m128i key = _mm_loadu_si128((const __m128i *)secret);
    __m128i data_key = _mm_xor_si128(data, key);
    /* Each 64-bit lane: low 32 bits times high 32 bits of data ^ key. */
    __m128i key_hi = _mm_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    __m128i product = _mm_mul_epu32(data_key, key_hi);
    /* The other lane's input is added to each accumulator. */
    __m128i swapped = _mm_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm_add_epi64(acc, _mm_add_epi64(product, swapped));
}

static inline void accumulate_stripe(__m128i *acc, const uint8_t *in, const uint8_t *secret) {
    for (int i = 0; i < 4; i++)
        acc[i] = accumulate_lane(acc[i], _mm_loadu_si128((const __m128i *)(in + 16 * i)),
                                 secret + 16 * i);
}

/* accumulate_stripe, storing the stripe at out (16-byte aligned) as it goes, with streaming
 * stores: the destination is written once, never read into the cache first. */
static inline void accumulate_copy_stripe(__m128i *acc, const uint8_t *in, uint8_t *out,
                                          const uint8_t *secret) {
    for (int i = 0; i < 4; i++) {
        __m128i data = _mm_loadu_si128((const __m128i *)(in + 16 * i));
        _mm_stream_si128((__m128i *)(out + 16 * i), data);
        acc[i] = accumulate_lane(acc[i], data, secret + 16 * i);
    }
}

static inline void stores_done(void) { _mm_sfence(); }

static inline void scramble(__m128i *acc, const uint8_t *secret) {
    const __m128i prime = _mm_set1_epi32((int)PRIME32_1);
    for (int i = 0; i < 4; i++) {
        __m128i a = acc[i];
        a = _mm_xor_si128(a, _mm_srli_epi64(a, 47));
        a = _mm_xor_si128(a, _mm_loadu_si128((const __m128i *)(secret + 16 * i)));
        __m128i a_hi = _mm_shuffle_epi32(a, _MM_SHUFFLE(0, 3, 0, 1));
        __m128i low = _mm_mul_epu32(a, prime);
        __m128i high = _mm_mul_epu32(a_hi, prime);
        acc[i] = _mm_add_epi64(low, _mm_slli_epi64(high, 32));
    }
}

static inline void store_acc(const __m128i *acc, uint64_t *out) {
    for (int i = 0; i < 4; i++)
        _mm_storeu_si128((__m128i *)(out + 2 * i), acc[i]);
}

static inline void init_acc(__m128i *acc, const uint64_t *init) {
    for (int i = 0; i < 4; i++)
        acc[i] = _mm_loadu_si128((const __m128i *)(init + 2 * i));
}
#else
typedef uint64_t acc_t[8];

static inline void accumulate_stripe(uint64_t *acc, const uint8_t *in, const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t data = read64(in + 8 * i);
        uint64_t data_key = data ^ read64(secret + 8 * i);
        acc[i ^ 1] += data;
        acc[i] += (data_key & 0xFFFFFFFFULL) * (data_key >> 32);
    }
}

static inline void accumulate_copy_stripe(uint64_t *acc, const uint8_t *in, uint8_t *out,
                                          const uint8_t *secret) {
    memcpy(out, in, STRIPE_LEN);
    accumulate_stripe(acc, in, secret);
}

static inline void stores_done(void) {}

static inline void scramble(uint64_t *acc, const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(secret + 8 * i);
        acc[i] = a * PRIME32_1;
    }
}

static inline void store_acc(const uint64_t *acc, uint64_t *out) { memcpy(out, acc, 64); }

static inline void init_acc(uint64_t *acc, const uint64_t *init) { memcpy(acc, init, 64); }
#endif

static inline void accumulate(acc_t acc, const uint8_t *in, size_t stripes) {
    for (size_t n = 0; n < stripes; n++)
        accumulate_stripe(acc, in + n * STRIPE_LEN, SECRET + n * SECRET_CONSUME_RATE);
}

static const uint64_t INIT_ACC[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3,
                                     PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};

void kvtier_xxh3_stream_init(struct kvtier_xxh3_stream *stream) {
    memcpy(stream->acc, INIT_ACC, sizeof stream->acc);
    stream->blocks_done = 0;
}

void kvtier_xxh3_stream_update(struct kvtier_xxh3_stream *stream, const uint8_t *data,
                               size_t available, size_t total) {
    /* The last block (whole or not) is hashed with the final stripe: never here. */
    size_t blocks = (total - 1) / BLOCK_LEN;
    size_t ready = available / BLOCK_LEN < blocks ? available / BLOCK_LEN : blocks;
    if (ready <= stream->blocks_done)
        return;
    acc_t acc;
    init_acc(acc, stream->acc);
    for (size_t n = stream->blocks_done; n < ready; n++) {
        accumulate(acc, data + n * BLOCK_LEN, STRIPES_PER_BLOCK);
        scramble(acc, SECRET + SECRET_SIZE - STRIPE_LEN);
    }
    store_acc(acc, stream->acc);
    stream->blocks_done = ready;
}

void kvtier_xxh3_stream_copy(struct kvtier_xxh3_stream *stream, uint8_t *dst, const uint8_t *src,
                             size_t offset, size_t len, size_t total) {
    size_t copied = 0;
    size_t blocks = (total - 1) / BLOCK_LEN;
    /* Fused only where this chunk starts at the next block to hash (chunks of whole blocks) and
     * the stores can be aligned; otherwise a copy, and the digest hashes the rest from dst. */
    if (offset == stream->blocks_done * BLOCK_LEN && ((uintptr_t)(dst + offset) & 15) == 0) {
        size_t end = (offset + len) / BLOCK_LEN < blocks ? (offset + len) / BLOCK_LEN : blocks;
        if (end > stream->blocks_done) {
            acc_t acc;
            init_acc(acc, stream->acc);
            for (size_t n = stream->blocks_done; n < end; n++) {
                const uint8_t *in = src + (n * BLOCK_LEN - offset);
                uint8_t *out = dst + n * BLOCK_LEN;
                for (size_t i = 0; i < STRIPES_PER_BLOCK; i++)
                    accumulate_copy_stripe(acc, in + i * STRIPE_LEN, out + i * STRIPE_LEN,
                                           SECRET + i * SECRET_CONSUME_RATE);
                scramble(acc, SECRET + SECRET_SIZE - STRIPE_LEN);
            }
            store_acc(acc, stream->acc);
            copied = (end - stream->blocks_done) * BLOCK_LEN;
            stream->blocks_done = end;
        }
    }
    memcpy(dst + offset + copied, src + copied, len - copied);
    stores_done(); /* streaming stores are weakly ordered: publish them before returning */
}

uint64_t kvtier_xxh3_stream_digest(struct kvtier_xxh3_stream *stream, const uint8_t *data,
                                   size_t len) {
    kvtier_xxh3_stream_update(stream, data, len, len);
    size_t blocks = stream->blocks_done;
    acc_t acc;
    init_acc(acc, stream->acc);
    size_t stripes = ((len - 1) - BLOCK_LEN * blocks) / STRIPE_LEN;
    accumulate(acc, data + blocks * BLOCK_LEN, stripes);
    accumulate_stripe(acc, data + len - STRIPE_LEN,
                      SECRET + SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);

    uint64_t lanes[8];
    store_acc(acc, lanes);
    uint64_t result = (uint64_t)len * PRIME64_1;
    for (int i = 0; i < 4; i++)
        result += mul128_fold64(lanes[2 * i] ^ read64(SECRET + SECRET_MERGEACCS_START + 16 * i),
                                lanes[2 * i + 1] ^
                                    read64(SECRET + SECRET_MERGEACCS_START + 16 * i + 8));
    return avalanche(result);
}

uint64_t kvtier_xxh3_64_long(const uint8_t *data, size_t len) {
    struct kvtier_xxh3_stream stream;
    kvtier_xxh3_stream_init(&stream);
    return kvtier_xxh3_stream_digest(&stream, data, len);
}
