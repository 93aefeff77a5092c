/* MPI as a peer of tensorwire's Rust clients: the rank program of mpi_peer.py's `MpiC`, in C
 * against Open MPI with no interpreter in the loop, so the suite can set tensorwire's Rust
 * figures beside MPI's own (mpi4py's ranks, the same cells, are the Python peers).
 *
 * It does exactly what mpi_peer.py's ranks do, cell by cell: the driver (bench.py) steers both
 * ranks over a Unix socket with one JSON line per cell ({"mode": ..., "size": ..., "buffers":
 * ..., "inflight": ..., "gap": ..., "seconds": ...}, or {"quit": true}); rank 0 (the client)
 * measures and answers {"value": X}, rank 1 (the server) answers {"done": true}; a failure is
 * answered {"error": "..."}. Per message: one-way = the buffers to rank 1, which answers an
 * 8-byte ack with the byte count (checked); RTT = the buffers there and back (lengths checked);
 * in flight = K requests outstanding, rank 1 echoing each as it completes. Each buffer is its
 * own message (tag = its index); receives go into buffers allocated once per cell. Timing is
 * cells.py's: one untimed warm-up; sequential cells run until `seconds` have passed and at
 * least 100 round trips (RTT of at most 1 MiB) or 3 messages were timed, each after an untimed
 * sleep of `gap`; RTT is the median latency, one-way GB/s of payload; a window keeps K requests
 * outstanding from the first send to the last reply (at least K + 3 sent), asks/s.
 *
 *     mpicc -O2 -o mpi_rank mpi_rank.c && mpirun -n 2 ./mpi_rank --rank SOCKET   (not for people)
 */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { ACK_TAG = 200, STOP_TAG = 999, REPLY_TAG = 100, LINE_MAX_LEN = 4096 };
static const size_t MIB = 1 << 20;
/* numpy asks for transparent huge pages on arrays from this size (the Python ranks' buffers
 * are numpy arrays), in 2 MiB-aligned memory. */
static const size_t HUGE_FROM = 4 << 20, HUGE_ALIGN = 2 << 20;

struct cell {
    char mode[16]; /* oneway | rtt | inflight */
    long size, buffers, inflight;
    double gap, seconds;
};

/* One request's receives and sends (rank 0) or one slot's receives (rank 1). */
struct slot {
    unsigned char **bufs;
    MPI_Request *recv, *send;
};

static char error[512];

static int fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(error, sizeof error, format, args);
    va_end(args);
    return -1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The bytes of buffer `i` of `n`: `size` over `n`, the last taking the rest (as ptr1-bench's). */
static long length_of(const struct cell *c, long i) {
    long each = c->size / c->buffers;
    return i + 1 < c->buffers ? each : c->size - each * (c->buffers - 1);
}

/* ---- the driver's lines ------------------------------------------------------------------- */

/* The number after `"key": ` in a flat JSON line, or NaN. */
static double json_number(const char *line, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *at = strstr(line, quoted);
    return at ? strtod(at + strlen(quoted), NULL) : NAN;
}

/* A whole number in [1, INT32_MAX] after `"key": `, or -1. */
static long json_count(const char *line, const char *key) {
    double value = json_number(line, key);
    return value >= 1 && value <= (double)INT32_MAX && value == floor(value) ? (long)value : -1;
}

static int parse(const char *line, struct cell *c) {
    const char *at = strstr(line, "\"mode\":");
    if (!at || sscanf(at + 7, " \"%15[a-z]\"", c->mode) != 1) return fail("no mode in %s", line);
    c->size = json_count(line, "size");
    c->buffers = json_count(line, "buffers");
    c->inflight = json_count(line, "inflight");
    c->gap = json_number(line, "gap");
    c->seconds = json_number(line, "seconds");
    if (c->size < 1 || c->buffers < 1 || c->buffers > 1024 || c->inflight < 1 ||
        c->inflight > 4096 || !(c->gap >= 0 && c->gap <= 60) ||
        !(c->seconds > 0 && c->seconds <= 3600))
        return fail("a case this rank cannot run: %s", line);
    return 0;
}

/* ---- the cells ---------------------------------------------------------------------------- */

static long slots_of(const struct cell *c) { return strcmp(c->mode, "inflight") ? 1 : c->inflight; }

/* Untouched memory for one buffer, as numpy's np.empty gives the Python ranks (huge pages
 * asked for from HUGE_FROM, as numpy does); NULL when memory runs out. */
static unsigned char *buffer_new(size_t len) {
    if (len < HUGE_FROM) return malloc(len ? len : 1);
    void *memory = NULL;
    if (posix_memalign(&memory, HUGE_ALIGN, len)) return NULL;
    madvise(memory, len, MADV_HUGEPAGE); /* advice: a kernel without THP ignores it */
    return memory;
}

static void slots_free(const struct cell *c, struct slot *slots, long count) {
    for (long k = 0; slots && k < count; k++) {
        for (long j = 0; slots[k].bufs && j < c->buffers; j++) free(slots[k].bufs[j]);
        free(slots[k].bufs);
        free(slots[k].recv);
        free(slots[k].send);
    }
    free(slots);
}

/* `count` slots of the case's buffers, each with room for one request per buffer each way;
 * NULL (nothing kept) when memory runs out. */
static struct slot *slots_new(const struct cell *c, long count) {
    struct slot *slots = calloc((size_t)count, sizeof *slots);
    for (long k = 0; slots && k < count; k++) {
        slots[k].bufs = calloc((size_t)c->buffers, sizeof *slots[k].bufs);
        slots[k].recv = calloc((size_t)c->buffers, sizeof(MPI_Request));
        slots[k].send = calloc((size_t)c->buffers, sizeof(MPI_Request));
        int ok = slots[k].bufs && slots[k].recv && slots[k].send;
        for (long j = 0; ok && j < c->buffers; j++)
            ok = (slots[k].bufs[j] = buffer_new((size_t)length_of(c, j))) != NULL;
        if (!ok) {
            slots_free(c, slots, k + 1);
            return NULL;
        }
    }
    return slots;
}

/* Whether both ranks have what they allocated (`ok` here): one that could not makes both give
 * up the cell before any message, so neither waits for the other forever. */
static int both_allocated(int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all;
}

struct client {
    const struct cell *c;
    unsigned char **data;
    struct slot *slots;
    long count, issued;
    int64_t ack;
    MPI_Status *statuses;
    /* Replies of the wrong length: reported once every outstanding request has finished (an
     * early return would leave rank 1 waiting to send them back). */
    long wrong;
};

/* Starts request number `issued`: its receives (the ack, or the echo into its slot), then the
 * sends of the payload. */
static long client_send(struct client *cl) {
    const struct cell *c = cl->c;
    long k = cl->issued++ % cl->count;
    struct slot *s = &cl->slots[k];
    if (!strcmp(c->mode, "oneway"))
        MPI_Irecv(&cl->ack, 1, MPI_INT64_T, 1, ACK_TAG, MPI_COMM_WORLD, &s->recv[0]);
    else
        for (long j = 0; j < c->buffers; j++)
            MPI_Irecv(s->bufs[j], (int)length_of(c, j), MPI_BYTE, 1, REPLY_TAG + (int)j,
                      MPI_COMM_WORLD, &s->recv[j]);
    for (long j = 0; j < c->buffers; j++)
        MPI_Isend(cl->data[j], (int)length_of(c, j), MPI_BYTE, 1, (int)j, MPI_COMM_WORLD,
                  &s->send[j]);
    return k;
}

/* Finishes the request in slot `k` and checks what came back (a wrong length is counted, the
 * first one described in `error`). */
static void client_wait(struct client *cl, long k) {
    const struct cell *c = cl->c;
    struct slot *s = &cl->slots[k];
    int oneway = !strcmp(c->mode, "oneway");
    int receives = oneway ? 1 : (int)c->buffers;
    MPI_Waitall(receives, s->recv, cl->statuses);
    MPI_Waitall((int)c->buffers, s->send, MPI_STATUSES_IGNORE);
    long got = 0;
    if (oneway) {
        got = (long)cl->ack;
    } else {
        for (int j = 0; j < receives; j++) {
            int n = 0;
            MPI_Get_count(&cl->statuses[j], MPI_BYTE, &n);
            got += n;
        }
    }
    if (got != c->size && cl->wrong++ == 0)
        fail("%s: %ld bytes came back, %ld were sent", oneway ? "sink" : "echo", got, c->size);
}

static void sleep_for(double seconds) {
    struct timespec left = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    while (nanosleep(&left, &left) && errno == EINTR) {
    }
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One-way or RTT, one message at a time; the figure, or -1. */
static int sequential(struct client *cl, double *figure) {
    const struct cell *c = cl->c;
    int rtt = !strcmp(c->mode, "rtt");
    long min_ops = rtt && (size_t)c->size <= MIB ? 100 : 3;
    client_wait(cl, client_send(cl));
    size_t cap = 1024, n = 0;
    double *latencies = malloc(cap * sizeof *latencies);
    if (!latencies) return fail("out of memory");
    double start = now(), elapsed;
    while ((elapsed = now() - start) < c->seconds || (long)n < min_ops) {
        if (c->gap > 0) sleep_for(c->gap);
        double t = now();
        client_wait(cl, client_send(cl));
        if (n == cap) {
            double *more = realloc(latencies, 2 * cap * sizeof *latencies);
            if (!more) {
                free(latencies);
                return fail("out of memory");
            }
            latencies = more;
            cap *= 2;
        }
        latencies[n++] = now() - t;
    }
    if (rtt) {
        qsort(latencies, n, sizeof *latencies, compare_doubles);
        *figure = (n % 2 ? latencies[n / 2] : (latencies[n / 2 - 1] + latencies[n / 2]) / 2) * 1e6;
    } else {
        *figure = (double)n * (double)c->size / elapsed / 1e9;
    }
    free(latencies);
    return 0;
}

/* K requests outstanding; asks/s, or -1. Slots are reused in issue order, so the oldest
 * outstanding request is always in slot `done % K`. */
static int windowed(struct client *cl, double *figure) {
    const struct cell *c = cl->c;
    client_wait(cl, client_send(cl));
    cl->issued = 0;
    double start = now();
    long sent = 0, done = 0;
    for (; sent < c->inflight; sent++) client_send(cl);
    while (done < sent) {
        client_wait(cl, done % cl->count);
        done++;
        if (now() - start < c->seconds || sent < c->inflight + 3) {
            client_send(cl);
            sent++;
        }
    }
    *figure = (double)done / (now() - start);
    return 0;
}

/* Rank 0: times the case's messages to rank 1, then tells it to stop. */
static int client(const struct cell *c, double *figure) {
    struct client cl = {.c = c, .count = slots_of(c)};
    int result = -1;
    cl.data = calloc((size_t)c->buffers, sizeof *cl.data);
    cl.statuses = calloc((size_t)c->buffers, sizeof *cl.statuses);
    cl.slots = slots_new(c, cl.count);
    int ok = cl.data && cl.statuses && cl.slots;
    for (long j = 0; ok && j < c->buffers; j++) {
        ok = (cl.data[j] = buffer_new((size_t)length_of(c, j))) != NULL;
        if (ok) memset(cl.data[j], 0xA5 ^ (int)(j & 0xFF), (size_t)length_of(c, j));
    }
    if (!both_allocated(ok)) {
        fail("a rank could not allocate the case's buffers");
    } else {
        result = strcmp(c->mode, "inflight") ? sequential(&cl, figure) : windowed(&cl, figure);
        int64_t stop = 0;
        MPI_Send(&stop, 1, MPI_INT64_T, 1, STOP_TAG, MPI_COMM_WORLD);
        if (result == 0 && cl.wrong) {
            char first[sizeof error];
            memcpy(first, error, sizeof first);
            result = fail("%s (%ld such replies)", first, cl.wrong);
        }
        if (result == 0 && !isfinite(*figure)) result = fail("no figure (too few messages)");
    }
    for (long j = 0; cl.data && j < c->buffers; j++) free(cl.data[j]);
    free(cl.data);
    free(cl.statuses);
    slots_free(c, cl.slots, cl.count);
    return result;
}

static void post(const struct cell *c, struct slot *s) {
    for (long j = 0; j < c->buffers; j++)
        MPI_Irecv(s->bufs[j], (int)length_of(c, j), MPI_BYTE, 0, (int)j, MPI_COMM_WORLD,
                  &s->recv[j]);
}

/* Rank 1: a receive posted per buffer of each of K slots, served in order: the ack (one-way) or
 * the buffers back (echo); until the client's stop. */
static int server(const struct cell *c) {
    long count = slots_of(c);
    struct slot *slots = slots_new(c, count);
    MPI_Request *any = calloc((size_t)c->buffers + 1, sizeof *any);
    MPI_Status *statuses = calloc((size_t)c->buffers, sizeof *statuses);
    int64_t stop_word = 0, ack = 0;
    if (!both_allocated(slots && any && statuses)) {
        slots_free(c, slots, slots ? count : 0);
        free(any);
        free(statuses);
        return fail("a rank could not allocate the case's buffers");
    }
    MPI_Request stop;
    MPI_Irecv(&stop_word, 1, MPI_INT64_T, 0, STOP_TAG, MPI_COMM_WORLD, &stop);
    for (long k = 0; k < count; k++) post(c, &slots[k]);
    for (long k = 0;; k = (k + 1) % count) {
        struct slot *s = &slots[k];
        any[0] = stop;
        memcpy(&any[1], s->recv, (size_t)c->buffers * sizeof *any);
        int index = 0;
        MPI_Status first;
        MPI_Waitany((int)c->buffers + 1, any, &index, &first);
        if (index == 0) break;
        s->recv[index - 1] = MPI_REQUEST_NULL; /* completed by Waitany */
        MPI_Waitall((int)c->buffers, s->recv, statuses);
        statuses[index - 1] = first; /* a null request's status is empty: Waitany's is it */
        if (!strcmp(c->mode, "oneway")) {
            long total = 0;
            for (long j = 0; j < c->buffers; j++) {
                int n = 0;
                MPI_Get_count(&statuses[j], MPI_BYTE, &n);
                total += n;
            }
            ack = total;
            MPI_Send(&ack, 1, MPI_INT64_T, 0, ACK_TAG, MPI_COMM_WORLD);
        } else {
            for (long j = 0; j < c->buffers; j++)
                MPI_Isend(s->bufs[j], (int)length_of(c, j), MPI_BYTE, 0, REPLY_TAG + (int)j,
                          MPI_COMM_WORLD, &s->send[j]);
            MPI_Waitall((int)c->buffers, s->send, MPI_STATUSES_IGNORE);
        }
        post(c, s);
    }
    for (long k = 0; k < count; k++) { /* the receives the stop left posted */
        for (long j = 0; j < c->buffers; j++) MPI_Cancel(&slots[k].recv[j]);
        MPI_Waitall((int)c->buffers, slots[k].recv, MPI_STATUSES_IGNORE);
    }
    slots_free(c, slots, count);
    free(any);
    free(statuses);
    return 0;
}

/* ---- the control connection --------------------------------------------------------------- */

/* The driver's control connection: `*in` to read its lines, `*out` to answer (two streams on
 * one socket: C streams do not switch between reading and writing without a seek). */
static int connect_to(const char *path, int rank, FILE **in, FILE **out) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof address.sun_path) return -1;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int copy = -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0 || (copy = dup(fd)) < 0 ||
        !(*in = fdopen(fd, "r"))) {
        close(fd);
        if (copy >= 0) close(copy);
        return -1;
    }
    if (!(*out = fdopen(copy, "w"))) {
        fclose(*in);
        close(copy);
        return -1;
    }
    fprintf(*out, "%d\n", rank);
    fflush(*out);
    return 0;
}

/* `error` as a JSON string body: quotes and backslashes escaped, control bytes dropped. */
static void answer_error(FILE *stream) {
    fputs("{\"error\": \"", stream);
    for (const char *p = error; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', stream);
        if ((unsigned char)*p >= 0x20) fputc(*p, stream);
    }
    fputs("\"}\n", stream);
}

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "--rank")) {
        fprintf(stderr, "usage: mpirun -n 2 %s --rank SOCKET (started by mpi_peer.py)\n", argv[0]);
        return 2;
    }
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    FILE *in = NULL, *stream = NULL;
    if (connect_to(argv[2], rank, &in, &stream)) {
        perror("mpi_rank: the driver's control socket");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char line[LINE_MAX_LEN];
    while (fgets(line, sizeof line, in)) {
        if (strstr(line, "\"quit\"")) break;
        struct cell c;
        double figure = 0;
        error[0] = 0;
        if (parse(line, &c)) {
            answer_error(stream);
            continue;
        }
        int failed = rank == 0 ? client(&c, &figure) : server(&c);
        if (failed)
            answer_error(stream);
        else if (rank == 0)
            fprintf(stream, "{\"value\": %.17g}\n", figure);
        else
            fputs("{\"done\": true}\n", stream);
        fflush(stream);
    }
    fclose(in);
    fclose(stream);
    MPI_Finalize();
    return 0;
}
