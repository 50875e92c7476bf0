/* The shared tier's socket receives, without the GIL (see sockread.h).
 *
 * Why native: an engine's loop runs Python without pause while a request waits for its
 * restore, so every time an I/O thread gives the GIL up (a socket call, a checksum, a copy) it
 * may wait out the interpreter's switch interval to get it back, and beside a busy Python
 * thread those waits take several times the read itself (docs/shared-tier.md, "Beside a busy
 * Python thread"). One value received in one call (kvtier_recv_all) gives the GIL up once per
 * value; a thread's share of a load sent, received, hashed, claimed and copied in one call
 * (kvtier_exchange_gets) gives it up once per share instead of about four times per record.
 */
#define _GNU_SOURCE
#include "sockread.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "claim.h"
#include "xxh3.h"

/* Wait until fd is ready for events, at most timeout_ms; a SOCK_ status (DONE: ready). */
static int wait_for(int fd, short events, int timeout_ms, int *error) {
    struct pollfd waiting = {.fd = fd, .events = events};
    int ready = poll(&waiting, 1, timeout_ms);
    if (ready == 0)
        return KVTIER_SOCK_TIMEOUT;
    if (ready < 0 && errno != EINTR) {
        *error = errno;
        return KVTIER_SOCK_ERROR;
    }
    return KVTIER_SOCK_DONE;
}

/* One recv() into buf, waiting while the socket has nothing; > 0 bytes, or -status. */
static ssize_t recv_some(int fd, uint8_t *buf, size_t len, int timeout_ms, int *error) {
    for (;;) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n > 0)
            return n;
        if (n == 0)
            return -KVTIER_SOCK_EOF;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *error = errno;
            return -KVTIER_SOCK_ERROR;
        }
        int status = wait_for(fd, POLLIN, timeout_ms, error);
        if (status != KVTIER_SOCK_DONE)
            return -status;
    }
}

/* kvtier_recv_all, hashing the bytes as they land when stream is not NULL (buf is then the
 * whole input of len bytes, hashed while the CPU cache still holds each chunk). */
static int recv_hashing(int fd, uint8_t *buf, size_t len, int timeout_ms, size_t *got,
                        int *error, struct kvtier_xxh3_stream *stream) {
    size_t pos = 0;
    int status = KVTIER_SOCK_DONE;
    while (pos < len) {
        ssize_t n = recv_some(fd, buf + pos, len - pos, timeout_ms, error);
        if (n < 0) {
            status = (int)-n;
            break;
        }
        pos += (size_t)n;
        if (stream != NULL)
            kvtier_xxh3_stream_update(stream, buf, pos, len);
    }
    *got = pos;
    return status;
}

int kvtier_recv_all(int fd, uint8_t *buf, size_t len, int timeout_ms, size_t *got, int *error) {
    return recv_hashing(fd, buf, len, timeout_ms, got, error, NULL);
}

static int send_all(int fd, const uint8_t *buf, size_t len, int timeout_ms, int *error) {
    size_t pos = 0;
    while (pos < len) {
        ssize_t n = send(fd, buf + pos, len - pos, MSG_NOSIGNAL);
        if (n >= 0) {
            pos += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *error = errno;
            return KVTIER_SOCK_ERROR;
        }
        int status = wait_for(fd, POLLOUT, timeout_ms, error);
        if (status != KVTIER_SOCK_DONE)
            return status;
    }
    return KVTIER_SOCK_DONE;
}

/* Receive into buf until it holds len bytes (from *got on), comparing what arrived with
 * expected: SOCK_DONE when all match, SOCK_OTHER_REPLY at the first byte that differs. */
static int recv_matching(int fd, uint8_t *buf, size_t len, const uint8_t *expected, size_t *got,
                         int timeout_ms, int *error) {
    while (*got < len) {
        ssize_t n = recv_some(fd, buf + *got, len - *got, timeout_ms, error);
        if (n < 0)
            return (int)-n;
        *got += (size_t)n;
        if (memcmp(buf, expected, *got) != 0)
            return KVTIER_SOCK_OTHER_REPLY;
    }
    return KVTIER_SOCK_DONE;
}

/* Every RESP reply is at least this long ("_\r\n", RESP3's nil). */
#define SHORTEST_REPLY 3

/* Read a reply's first line: SOCK_DONE when it is get->line, or a nil reply (RESP3 "_\r\n" or
 * RESP2 "$-1\r\n"), read whole, with get->landed = KVTIER_GET_NIL; else SOCK_OTHER_REPLY with
 * the bytes read in result->unparsed. It first reads the shortest reply's length, then no more
 * than the line still lacks, and a reply of another form differs from the line within its own
 * first line (the line ends in \r\n, and a digit never equals \r): the recvs never wait for
 * bytes that are not coming, and a nil reply is read without a byte of the next reply. */
static int recv_line(int fd, struct kvtier_get *get, int timeout_ms,
                     struct kvtier_exchange *result) {
    static const uint8_t resp3_nil[] = "_\r\n", resp2_nil[] = "$-1\r\n";
    uint8_t *line = result->unparsed;
    size_t got = 0;
    int status = kvtier_recv_all(fd, line, SHORTEST_REPLY, timeout_ms, &got, &result->error);
    if (status != KVTIER_SOCK_DONE)
        return status;
    if (memcmp(line, resp3_nil, SHORTEST_REPLY) == 0) {
        get->landed = KVTIER_GET_NIL;
        return KVTIER_SOCK_DONE;
    }
    const uint8_t *expected = memcmp(line, resp2_nil, SHORTEST_REPLY) == 0 ? resp2_nil : get->line;
    size_t len = expected == resp2_nil ? sizeof resp2_nil - 1 : get->line_len;
    status = memcmp(line, expected, SHORTEST_REPLY) == 0
                 ? recv_matching(fd, line, len, expected, &got, timeout_ms, &result->error)
                 : KVTIER_SOCK_OTHER_REPLY;
    if (status == KVTIER_SOCK_DONE && expected == resp2_nil)
        get->landed = KVTIER_GET_NIL;
    if (status == KVTIER_SOCK_OTHER_REPLY)
        result->unparsed_len = got;
    return status;
}

/* Receive the rest of an expected reply (header, payload into bounce, trailer), then claim the
 * load and copy the payload into its row. */
static int recv_value(int fd, struct kvtier_get *get, size_t header_len, uint8_t *bounce,
                      int checksum, int timeout_ms, int *error) {
    size_t got;
    int status = kvtier_recv_all(fd, get->header, header_len, timeout_ms, &got, error);
    if (status != KVTIER_SOCK_DONE)
        return status;
    struct kvtier_xxh3_stream stream;
    int hashing = checksum && kvtier_record_hashes_payload(get->header, header_len,
                                                           get->payload_len);
    if (hashing)
        kvtier_xxh3_stream_init(&stream);
    status = recv_hashing(fd, bounce, get->payload_len, timeout_ms, &got, error,
                          hashing ? &stream : NULL);
    if (status != KVTIER_SOCK_DONE)
        return status;
    uint8_t trailer[2];
    status = kvtier_recv_all(fd, trailer, sizeof trailer, timeout_ms, &got, error);
    if (status != KVTIER_SOCK_DONE)
        return status;
    if (trailer[0] != '\r' || trailer[1] != '\n')
        return KVTIER_SOCK_BAD_TRAILER;
    if (hashing) {
        get->payload_checksum = kvtier_xxh3_stream_digest(&stream, bounce, get->payload_len);
        get->checksummed = 1;
    }
    /* Received into bounce, unclaimed, since the wait for the server may be long; the claim
     * is held only for the copy. */
    if (!kvtier_claim_move(get->cell, KVTIER_CLAIM_PENDING, KVTIER_CLAIM_COPYING)) {
        get->landed = KVTIER_GET_NOT_CLAIMED;
        return KVTIER_SOCK_DONE;
    }
    memcpy(get->out, bounce, get->payload_len);
    kvtier_claim_move(get->cell, KVTIER_CLAIM_COPYING, KVTIER_CLAIM_WRITTEN);
    get->landed = KVTIER_GET_COPIED;
    return KVTIER_SOCK_DONE;
}

void kvtier_exchange_gets(int fd, struct kvtier_get *gets, size_t n, size_t header_len,
                          uint8_t *bounce, size_t window, int checksum, int timeout_ms,
                          struct kvtier_exchange *result) {
    memset(result, 0, sizeof *result);
    if (window == 0)
        window = 1;
    size_t in_flight = 0; /* sent, reply not received */
    int status = KVTIER_SOCK_DONE;
    for (size_t i = 0; i < n && status == KVTIER_SOCK_DONE; i++) {
        /* Every GET before i was received or passed over, so i is decided here at the latest. */
        while (result->decided < n && in_flight < window && status == KVTIER_SOCK_DONE) {
            struct kvtier_get *next = &gets[result->decided];
            if (kvtier_claim_state(next->cell) != KVTIER_CLAIM_PENDING) {
                next->landed = KVTIER_GET_NOT_SENT; /* abandoned: nothing to ask for */
                result->decided++;
                continue;
            }
            status = send_all(fd, next->request, next->request_len, timeout_ms, &result->error);
            if (status == KVTIER_SOCK_DONE) {
                next->landed = KVTIER_GET_AWAITING;
                result->decided++;
                in_flight++;
            }
        }
        if (status != KVTIER_SOCK_DONE)
            break;
        if (gets[i].landed != KVTIER_GET_NOT_SENT) {
            status = recv_line(fd, &gets[i], timeout_ms, result);
            if (status == KVTIER_SOCK_DONE && gets[i].landed != KVTIER_GET_NIL)
                status = recv_value(fd, &gets[i], header_len, bounce, checksum, timeout_ms,
                                    &result->error);
            if (status != KVTIER_SOCK_DONE)
                break;
            in_flight--;
        }
        result->settled = i + 1;
    }
    result->status = status;
}
