/*
 * udpload: single-threaded UDP load generator for the Sluicegate partition
 * wire protocol (see sluicegate/codec.py). Built and run by bench/run.py.
 *
 * One UDP socket per simulated client, all multiplexed with epoll on one
 * thread. Every request carries a fresh request id (the server answers a
 * repeated id from its reply cache without charging).
 *
 * Modes:
 *   closed  each socket keeps exactly one request outstanding: send, wait for
 *           the reply (or the timeout), send the next one.
 *   open    paced: request i is due at start + i/rate (total over all
 *           sockets) and goes out on any socket that has nothing outstanding.
 *           Latency is measured from the *scheduled* time (so a late send
 *           counts against us: no coordinated omission); latency from the
 *           actual send is reported too (lat_send_*).
 *   fill    like closed, but keys are taken in order 0..keys-1, each exactly
 *           once; stops when all are answered (used to warm rules up and to
 *           fill a partition for the memory figure).
 *
 * Keys: "<prefix><n>" with n zero-padded to 12 digits (the same shape as
 * redis-benchmark's __rand_int__), or with --uuid a 36-char UUID-shaped
 * string derived from n.
 *
 * Output: one JSON line on stdout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HDR 14
#define ITEM_REPLY 33 /* status u8, remaining, retry_after_ms, capacity, window_ms u32, limit name 16 bytes */
#define MAX_BATCH 2048
#define MAX_KEY 64

enum { CLOSED, OPEN, FILL };

typedef struct {
    int fd;
    int busy;           /* a request is outstanding */
    uint64_t next_id;   /* next request id to use */
    uint64_t want_id;   /* id of the outstanding request */
    uint64_t sched_ns;  /* scheduled send time (open) or send time */
    uint64_t sent_ns;   /* actual send time */
    uint32_t batch;     /* checks in the outstanding request (fill: last batch may be short) */
} conn_t;

typedef struct {
    uint32_t *v;
    size_t n, cap;
} samples_t;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void push(samples_t *s, uint64_t ns) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : (1u << 20);
        s->v = realloc(s->v, s->cap * sizeof(uint32_t));
        if (!s->v) {
            perror("realloc");
            exit(2);
        }
    }
    s->v[s->n++] = ns > 0xffffffffull ? 0xffffffffu : (uint32_t)ns;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(samples_t *s, double p) {
    if (s->n == 0) return 0.0;
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i] / 1000.0; /* microseconds */
}

static double mean(samples_t *s) {
    if (s->n == 0) return 0.0;
    double t = 0;
    for (size_t i = 0; i < s->n; i++) t += s->v[i];
    return t / (double)s->n / 1000.0;
}

/* xorshift64* */
static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const char *prefix = "bucket:";
static int uuid_keys = 0;

static int make_key(char *out, uint64_t n) {
    if (uuid_keys) {
        uint64_t a = mix(n), b = mix(n ^ 0xdeadbeefcafef00dull);
        return snprintf(out, MAX_KEY, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(a >> 32),
                        (unsigned)((a >> 16) & 0xffff), (unsigned)(a & 0xffff), (unsigned)(b >> 48),
                        (unsigned long long)(b & 0xffffffffffffull));
    }
    return snprintf(out, MAX_KEY, "%s%012llu", prefix, (unsigned long long)n);
}

/* Build a CHECK request with `batch` keys into buf; returns its length (padded). */
static size_t build(uint8_t *buf, uint64_t id, uint32_t batch, int mode, uint64_t *fill_next, uint64_t keys,
                    uint32_t cost) {
    size_t off = HDR;
    buf[0] = 'S';
    buf[1] = 'G';
    buf[2] = 2; /* wire version */
    buf[3] = 1; /* OP_CHECK */
    for (int i = 0; i < 8; i++) buf[4 + i] = (uint8_t)(id >> (56 - 8 * i));
    buf[12] = (uint8_t)(batch >> 8);
    buf[13] = (uint8_t)batch;
    for (uint32_t i = 0; i < batch; i++) {
        uint64_t n = mode == FILL ? (*fill_next)++ : rnd() % keys;
        char key[MAX_KEY];
        int kl = make_key(key, n);
        buf[off] = (uint8_t)(kl >> 8);
        buf[off + 1] = (uint8_t)kl;
        buf[off + 2] = (uint8_t)(cost >> 24);
        buf[off + 3] = (uint8_t)(cost >> 16);
        buf[off + 4] = (uint8_t)(cost >> 8);
        buf[off + 5] = (uint8_t)cost;
        memcpy(buf + off + 6, key, (size_t)kl);
        off += 6 + (size_t)kl;
    }
    size_t need = HDR + (size_t)ITEM_REPLY * batch; /* pad up to the reply size */
    if (off < need) {
        memset(buf + off, 0, need - off);
        off = need;
    }
    return off;
}

static void usage(void) {
    fprintf(stderr,
            "usage: udpload --port P [--host 127.0.0.1] [--mode closed|open|fill] [--conns N]\n"
            "               [--duration S] [--warmup S] [--rate DGRAMS_PER_S] [--batch B] [--keys K]\n"
            "               [--prefix STR] [--uuid] [--timeout-ms MS] [--cost C] [--seed N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1";
    int port = 0, conns = 50, mode = CLOSED;
    double duration = 5.0, warmup = 0.0, rate = 0.0, timeout_ms = 200.0;
    uint32_t batch = 1, cost = 1;
    uint64_t keys = 100000, seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && ++i)
        if (ARG("--host")) host = v;
        else if (ARG("--port")) port = atoi(v);
        else if (ARG("--conns")) conns = atoi(v);
        else if (ARG("--duration")) duration = atof(v);
        else if (ARG("--warmup")) warmup = atof(v);
        else if (ARG("--rate")) rate = atof(v);
        else if (ARG("--batch")) batch = (uint32_t)atoi(v);
        else if (ARG("--keys")) keys = strtoull(v, NULL, 10);
        else if (ARG("--prefix")) prefix = v;
        else if (ARG("--timeout-ms")) timeout_ms = atof(v);
        else if (ARG("--cost")) cost = (uint32_t)atoi(v);
        else if (ARG("--seed")) seed = strtoull(v, NULL, 10);
        else if (ARG("--mode")) {
            if (!strcmp(v, "closed")) mode = CLOSED;
            else if (!strcmp(v, "open")) mode = OPEN;
            else if (!strcmp(v, "fill")) mode = FILL;
            else usage();
        } else if (!strcmp(a, "--uuid")) uuid_keys = 1;
        else usage();
#undef ARG
    }
    if (!port || conns < 1 || batch < 1 || batch > MAX_BATCH || keys < 1 || (mode == OPEN && rate <= 0)) usage();
    if (strcmp(host, "127.0.0.1") != 0) {
        fprintf(stderr, "udpload: only 127.0.0.1 is allowed as a target\n");
        return 2;
    }
    if (mode == FILL) warmup = 0;

    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake up on time for paced sends */
    rng_state ^= mix(seed ? seed : (uint64_t)getpid() ^ now_ns());
    if (!rng_state) rng_state = 1;

    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &dst.sin_addr);

    int ep = epoll_create1(0);
    conn_t *cs = calloc((size_t)conns, sizeof(conn_t));
    for (int i = 0; i < conns; i++) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) {
            perror("socket/connect");
            return 2;
        }
        cs[i].fd = fd;
        cs[i].next_id = rnd();
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    int *free_stack = malloc(sizeof(int) * (size_t)conns);
    int nfree = 0;
    for (int i = conns - 1; i >= 0; i--) free_stack[nfree++] = i;

    static uint8_t sbuf[65536], rbuf[65536];
    samples_t lat = {0}, lat_send = {0};
    uint64_t sent = 0, received = 0, lost = 0, late = 0, bad = 0, send_err = 0, denied = 0, items = 0;
    uint64_t fill_next = 0, fill_done = 0, backlog_max = 0;
    const uint64_t timeout = (uint64_t)(timeout_ms * 1e6);
    const uint64_t t_start = now_ns();
    const uint64_t t_meas = t_start + (uint64_t)(warmup * 1e9);
    const uint64_t t_end = t_meas + (uint64_t)(duration * 1e9);
    const double interval = mode == OPEN ? 1e9 / rate : 0;
    uint64_t sched_i = 0; /* open: index of the next request to schedule */
    uint64_t meas_start_sched = 0;
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0);
    uint64_t last_timeout_scan = t_start;

    for (;;) {
        uint64_t now = now_ns();
        int sending = now < t_end && !(mode == FILL && fill_next >= keys);
        if (!sending) {
            int outstanding = 0;
            for (int i = 0; i < conns; i++) outstanding += cs[i].busy;
            if (!outstanding || now > t_end + timeout) break;
        }
        /* send */
        if (sending) {
            if (mode == OPEN) {
                for (;;) {
                    uint64_t due = t_start + (uint64_t)((double)sched_i * interval);
                    if (due > now || nfree == 0) {
                        if (due <= now) {
                            uint64_t behind = (now - due) / (uint64_t)(interval > 1 ? interval : 1);
                            if (behind > backlog_max) backlog_max = behind;
                        }
                        break;
                    }
                    conn_t *c = &cs[free_stack[--nfree]];
                    c->want_id = c->next_id++;
                    size_t len = build(sbuf, c->want_id, batch, mode, &fill_next, keys, cost);
                    c->sched_ns = due;
                    c->sent_ns = now_ns();
                    c->batch = batch;
                    if (send(c->fd, sbuf, len, 0) < 0) send_err++;
                    c->busy = 1;
                    if (due >= t_meas) sent++;
                    else meas_start_sched = sched_i + 1;
                    sched_i++;
                }
            } else {
                while (nfree > 0 && !(mode == FILL && fill_next >= keys)) {
                    conn_t *c = &cs[free_stack[--nfree]];
                    uint32_t b = batch;
                    if (mode == FILL && fill_next + b > keys) b = (uint32_t)(keys - fill_next);
                    c->want_id = c->next_id++;
                    size_t len = build(sbuf, c->want_id, b, mode, &fill_next, keys, cost);
                    c->batch = b;
                    c->sched_ns = c->sent_ns = now_ns();
                    if (send(c->fd, sbuf, len, 0) < 0) send_err++;
                    c->busy = 1;
                    if (c->sent_ns >= t_meas && c->sent_ns < t_end) sent++;
                }
            }
        }
        /* wait */
        /* Sleep until a reply arrives, the next paced send is due, or 1 ms passes
         * (timeout scan); epoll_pwait2 takes a nanosecond timeout, so pacing
         * does not need to spin. */
        struct timespec wait = {0, 1000000};
        if (mode == OPEN && sending && nfree > 0) {
            uint64_t due = t_start + (uint64_t)((double)sched_i * interval);
            now = now_ns();
            uint64_t d = due > now ? due - now : 0;
            if (d < 1000000) wait.tv_nsec = (long)d;
        }
        struct epoll_event evs[256];
        int n = epoll_pwait2(ep, evs, 256, &wait, NULL);
        for (int e = 0; e < n; e++) {
            conn_t *c = &cs[evs[e].data.u32];
            for (;;) {
                ssize_t r = recv(c->fd, rbuf, sizeof rbuf, 0);
                if (r < 0) break; /* EAGAIN or ICMP error */
                uint64_t t = now_ns();
                if (r < HDR || rbuf[0] != 'S' || rbuf[1] != 'G' || rbuf[3] != 0x81) {
                    bad++;
                    continue;
                }
                uint64_t id = 0;
                for (int i = 0; i < 8; i++) id = (id << 8) | rbuf[4 + i];
                uint32_t cnt = (uint32_t)rbuf[12] << 8 | rbuf[13];
                if (!c->busy || id != c->want_id) {
                    late++; /* reply to a request we already gave up on */
                    continue;
                }
                if (cnt != c->batch || (size_t)r != HDR + (size_t)ITEM_REPLY * cnt) {
                    bad++;
                } else {
                    for (uint32_t i = 0; i < cnt; i++)
                        if ((rbuf[HDR + ITEM_REPLY * i] & 0x0f) != 0) denied++;
                }
                c->busy = 0;
                free_stack[nfree++] = (int)(c - cs);
                if (mode == FILL) {
                    fill_done += c->batch;
                    received++;
                    items += c->batch;
                    push(&lat, t - c->sent_ns);
                } else if (c->sched_ns >= t_meas && c->sched_ns < t_end) {
                    received++;
                    items += c->batch;
                    push(&lat, t - c->sched_ns);
                    push(&lat_send, t - c->sent_ns);
                }
            }
        }
        /* timeouts */
        now = now_ns();
        if (now - last_timeout_scan >= 1000000) {
            last_timeout_scan = now;
            for (int i = 0; i < conns; i++) {
                conn_t *c = &cs[i];
                if (c->busy && now - c->sent_ns > timeout) {
                    c->busy = 0;
                    free_stack[nfree++] = i;
                    if (mode == FILL || (c->sched_ns >= t_meas && c->sched_ns < t_end)) lost++;
                }
            }
        }
    }
    uint64_t t_stop = now_ns();
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                 (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 ((double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) +
                  (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec)) / 1e6;
    double wall = (double)(t_stop - t_start) / 1e9;
    double meas = mode == FILL ? wall : duration;
    (void)meas_start_sched;
    qsort(lat.v, lat.n, sizeof(uint32_t), cmp_u32);
    qsort(lat_send.v, lat_send.n, sizeof(uint32_t), cmp_u32);
    printf("{\"mode\": \"%s\", \"conns\": %d, \"batch\": %u, \"keys\": %llu, \"key_style\": \"%s\", "
           "\"duration_s\": %.3f, \"wall_s\": %.3f, \"target_rate\": %.1f, "
           "\"sent\": %llu, \"received\": %llu, \"lost\": %llu, \"late\": %llu, \"bad\": %llu, "
           "\"send_errors\": %llu, \"denied_items\": %llu, \"items\": %llu, \"backlog_max\": %llu, "
           "\"dgrams_per_s\": %.1f, \"decisions_per_s\": %.1f, "
           "\"lat_mean_us\": %.1f, \"lat_p50_us\": %.1f, \"lat_p90_us\": %.1f, \"lat_p99_us\": %.1f, "
           "\"lat_p999_us\": %.1f, \"lat_max_us\": %.1f, "
           "\"lat_send_p50_us\": %.1f, \"lat_send_p99_us\": %.1f, \"lat_send_p999_us\": %.1f, "
           "\"cpu_s\": %.3f, \"cpu_pct\": %.1f}\n",
           mode == CLOSED ? "closed" : mode == OPEN ? "open" : "fill", conns, batch, (unsigned long long)keys,
           uuid_keys ? "uuid36" : "prefix+12digits", meas, wall, rate, (unsigned long long)sent,
           (unsigned long long)received, (unsigned long long)lost, (unsigned long long)late,
           (unsigned long long)bad, (unsigned long long)send_err, (unsigned long long)denied,
           (unsigned long long)items, (unsigned long long)backlog_max, (double)received / meas,
           (double)items / meas, mean(&lat), pct(&lat, 0.50), pct(&lat, 0.90), pct(&lat, 0.99), pct(&lat, 0.999),
           lat.n ? lat.v[lat.n - 1] / 1000.0 : 0.0, pct(&lat_send, 0.50), pct(&lat_send, 0.99),
           pct(&lat_send, 0.999), cpu, 100.0 * cpu / wall);
    return 0;
}
