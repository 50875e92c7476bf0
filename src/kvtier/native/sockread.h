/* The shared tier's socket receives without the GIL (kvtier.store.shared.readinto, .batch). */
#ifndef KVTIER_SOCKREAD_H
#define KVTIER_SOCKREAD_H

#include <stddef.h>
#include <stdint.h>

/* How a receive or an exchange ended; kvtier.native.SocketStatuses names them for Python. */
enum kvtier_sock_status {
    KVTIER_SOCK_DONE = 0,
    KVTIER_SOCK_EOF = 1,         /* the peer closed first */
    KVTIER_SOCK_TIMEOUT = 2,     /* no data (or no room to send) for timeout_ms */
    KVTIER_SOCK_ERROR = 3,       /* a socket error: errno in error */
    KVTIER_SOCK_OTHER_REPLY = 4, /* exchange: a reply is not the expected bulk string */
    KVTIER_SOCK_BAD_TRAILER = 5, /* exchange: a bulk string does not end in \r\n */
};

/* Receive into buf until len bytes arrived, the peer closed, a wait for data lasted timeout_ms
 * (negative: no bound), or an error; *got is what arrived, *error the errno of SOCK_ERROR. The
 * socket may be non-blocking (Python sockets with a timeout are): each wait is a poll(). */
int kvtier_recv_all(int fd, uint8_t *buf, size_t len, int timeout_ms, size_t *got, int *error);

/* What became of one GET. */
enum kvtier_get_landed {
    KVTIER_GET_NOT_CLAIMED = 0, /* the value, but its load was no longer pending: out untouched */
    KVTIER_GET_COPIED = 1,      /* the value, claimed and copied into out */
    KVTIER_GET_NIL = 2,         /* no such key (a nil reply): out untouched */
    KVTIER_GET_NOT_SENT = 3,    /* its load was no longer pending when its turn to be sent came:
                                 * never asked for, out untouched */
    KVTIER_GET_AWAITING = 4,    /* sent; its reply not read (the exchange stopped before it) */
};

/* One GET of an exchange: its command, the first line its reply has when it is the expected
 * value (a bulk string of header_len + payload_len bytes), and where that value lands. */
struct kvtier_get {
    const uint8_t *request;
    size_t request_len;
    const uint8_t *line;
    size_t line_len; /* at most KVTIER_LINE_MAX */
    uint8_t *header; /* header_len bytes: the record's header */
    uint8_t *out;    /* payload_len bytes: the load's row, written only once claimed */
    size_t payload_len;
    int32_t *cell; /* the load's claim cell (claim.h) */
    /* Set for each GET decided (sent, or not sent): */
    int landed; /* enum kvtier_get_landed */
    int checksummed;
    uint64_t payload_checksum; /* XXH3-64 of the payload, where checksum asked and applicable */
};

#define KVTIER_LINE_MAX 32

struct kvtier_exchange {
    int status; /* enum kvtier_sock_status */
    int error;  /* errno of SOCK_ERROR */
    size_t decided; /* GETs sent or passed over (not sent, their load no longer pending) */
    size_t settled; /* GETs done with, in order: reply received whole, or not sent */
    /* SOCK_OTHER_REPLY: the bytes read of reply `settled`, maybe followed by later replies'
     * bytes; the rest of them are still on the socket. */
    uint8_t unparsed[KVTIER_LINE_MAX];
    size_t unparsed_len;
};

/* Send the GETs (at most window of them awaiting their reply at any time, so the server never
 * holds more than window values in its output buffers for this connection) and receive each
 * reply in turn: the expected bulk string's header into get->header and its payload into
 * bounce (hashed as it arrives, with checksum), then the load's claim, a copy of bounce into
 * out and the claim moved on to WRITTEN; or a nil reply (RESP2 or RESP3). A GET whose load is
 * no longer pending when its turn to be sent comes (abandoned at a deadline) is not sent. It
 * stops at the first reply of another form (SOCK_OTHER_REPLY) or any socket fault. Touches no
 * Python object: call it without the GIL. */
void kvtier_exchange_gets(int fd, struct kvtier_get *gets, size_t n, size_t header_len,
                          uint8_t *bounce, size_t window, int checksum, int timeout_ms,
                          struct kvtier_exchange *result);

#endif
