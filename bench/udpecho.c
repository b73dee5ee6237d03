/*
 * udpecho: a trivial UDP reflector that answers each Sluicegate CHECK
 * datagram with a correctly shaped reply (same request id, op | 0x80,
 * count items of 33 zero bytes = "allowed"), doing no other work.
 *
 * Used by bench/run.py to measure the ceiling of the load generator
 * (udpload): if the generator drives this far faster than it drives the
 * partition server, the generator is not what limits the server figure.
 *
 * usage: udpecho PORT   (binds 127.0.0.1:PORT, prints "ready" when bound)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define VLEN 64
#define HDR 14
#define ITEM 33

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: udpecho PORT\n");
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int size = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("bind");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    static unsigned char bufs[VLEN][65536];
    struct mmsghdr msgs[VLEN];
    struct iovec iov[VLEN];
    struct sockaddr_in peers[VLEN];
    for (;;) { /* runs until SIGTERM (default action: exit) */
        for (int i = 0; i < VLEN; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof bufs[i];
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &peers[i];
            msgs[i].msg_hdr.msg_namelen = sizeof peers[i];
        }
        int n = recvmmsg(fd, msgs, VLEN, MSG_WAITFORONE, NULL);
        if (n <= 0) continue;
        int out = 0;
        for (int i = 0; i < n; i++) {
            unsigned char *b = bufs[i];
            size_t len = msgs[i].msg_len;
            if (len < HDR || b[0] != 'S' || b[1] != 'G') continue;
            size_t count = (size_t)b[12] << 8 | b[13];
            size_t reply = HDR + ITEM * count;
            if (len < reply) continue; /* not padded: the real server drops it too */
            b[3] |= 0x80;
            memset(b + HDR, 0, reply - HDR);
            iov[i].iov_len = reply;
            if (out != i) {
                msgs[out] = msgs[i];
            }
            msgs[out].msg_hdr.msg_iov = &iov[i];
            out++;
        }
        if (out) sendmmsg(fd, msgs, (unsigned)out, 0);
    }
    return 0;
}
