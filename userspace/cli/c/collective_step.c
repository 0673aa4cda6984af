/* The training-step model of `xroce experiment collective`
 * (userspace/cli/src/experiment/collective/): a compute gap, then a
 * collective, repeated; every element of every result checked.
 *
 * usage: collective_step OPS SIZES ITERS WARMUP SCHEDULE OUT
 *
 *   OPS       comma list: allreduce, alltoall, allgather, reduce_scatter
 *   SIZES     comma list of sizes in bytes, as nccl-tests counts them: the
 *             buffer of an allreduce, the whole send buffer of an alltoall
 *             or reduce_scatter, the whole receive buffer of an allgather
 *             (rounded down to a multiple of 8 bytes per rank)
 *   ITERS     timed iterations per op and size
 *   WARMUP    untimed iterations before them (the first connects the ranks)
 *   SCHEDULE  CSV `iter,rank,gap_us`: each rank's compute gap in each timed
 *             iteration (the experiment draws it from its seed)
 *   OUT       rank 0 writes OUT (CSV `op,bytes,iter,rank,gap_s,coll_s`,
 *             one row per rank and timed iteration) and OUT.progress (a
 *             line per iteration, as it goes)
 *
 * The gap is a sleep: the model's compute runs on an accelerator, so the
 * host's cores stay free for the transport. gap_s is the time a rank really
 * spent between two collectives (the sleep, filling its inputs, checking
 * the last result); coll_s the time inside the collective call. Times come
 * from CLOCK_MONOTONIC. A wrong element aborts the job with
 * `collective_step: CHECK FAILED ...` on stderr. At the end rank 0 prints
 * `collective_step: ok: R ranks, C results checked`. Each rank first says
 * on stderr how the drop-in recovers loss (its XROCE_SELECTIVE_REPEAT, or
 * `unset`).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op { ALLREDUCE, ALLTOALL, ALLGATHER, REDUCE_SCATTER };
static const char *const OP_NAMES[] = {"allreduce", "alltoall", "allgather", "reduce_scatter"};

static int rank, nranks;

static void fail(const char *what) {
    fprintf(stderr, "collective_step: rank %d: %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* Inputs: distinct per rank, element and iteration, so a stale or
 * misplaced element fails the check. */
static int64_t reduce_input(int r, long i, int iter) {
    return (int64_t)(r + 1) * 1000003 + i % 7919 + iter;
}
static int64_t reduce_sum(long i, int iter) {
    return (int64_t)1000003 * nranks * (nranks + 1) / 2 + (int64_t)nranks * (i % 7919 + iter);
}
/* Element j of the chunk rank `from` sends to rank `to`. */
static int64_t alltoall_input(int from, int to, long j, int iter) {
    return ((int64_t)from * 65536 + to) * 4294967296LL + j % 1000003 + iter;
}
static int64_t allgather_input(int from, long j, int iter) {
    return (int64_t)(from + 1) * 4294967296LL + j % 1000003 + iter;
}

/* Elements per rank's chunk (or of the whole buffer for allreduce). */
static long elements(enum op op, long bytes) {
    long n = bytes / (long)sizeof(int64_t);
    return op == ALLREDUCE ? n : n / nranks;
}

static void fill(enum op op, long count, int iter, int64_t *send) {
    switch (op) {
    case ALLREDUCE:
        for (long i = 0; i < count; i++) send[i] = reduce_input(rank, i, iter);
        break;
    case REDUCE_SCATTER:
        for (long i = 0; i < count * nranks; i++) send[i] = reduce_input(rank, i, iter);
        break;
    case ALLTOALL:
        for (int p = 0; p < nranks; p++)
            for (long j = 0; j < count; j++) send[p * count + j] = alltoall_input(rank, p, j, iter);
        break;
    case ALLGATHER:
        for (long j = 0; j < count; j++) send[j] = allgather_input(rank, j, iter);
        break;
    }
}

static void run(enum op op, long count, const int64_t *send, int64_t *recv) {
    int c = (int)count;
    int rc = MPI_SUCCESS;
    switch (op) {
    case ALLREDUCE:
        rc = MPI_Allreduce(send, recv, c, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        rc = MPI_Reduce_scatter_block(send, recv, c, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLTOALL:
        rc = MPI_Alltoall(send, c, MPI_INT64_T, recv, c, MPI_INT64_T, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        rc = MPI_Allgather(send, c, MPI_INT64_T, recv, c, MPI_INT64_T, MPI_COMM_WORLD);
        break;
    }
    if (rc != MPI_SUCCESS) fail("the collective returned an error");
}

static void mismatch(enum op op, long bytes, int iter, long i, int64_t got, int64_t want) {
    fprintf(stderr,
            "collective_step: CHECK FAILED: %s of %ld bytes, iteration %d, rank %d, element %ld: "
            "got %lld, want %lld\n",
            OP_NAMES[op], bytes, iter, rank, i, (long long)got, (long long)want);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Checks every element this rank received. */
static void check(enum op op, long bytes, long count, int iter, const int64_t *recv) {
    switch (op) {
    case ALLREDUCE:
        for (long i = 0; i < count; i++)
            if (recv[i] != reduce_sum(i, iter)) mismatch(op, bytes, iter, i, recv[i], reduce_sum(i, iter));
        break;
    case REDUCE_SCATTER:
        for (long j = 0; j < count; j++) {
            int64_t want = reduce_sum(rank * count + j, iter);
            if (recv[j] != want) mismatch(op, bytes, iter, j, recv[j], want);
        }
        break;
    case ALLTOALL:
        for (int from = 0; from < nranks; from++)
            for (long j = 0; j < count; j++) {
                int64_t want = alltoall_input(from, rank, j, iter);
                if (recv[from * count + j] != want) mismatch(op, bytes, iter, from * count + j, recv[from * count + j], want);
            }
        break;
    case ALLGATHER:
        for (int from = 0; from < nranks; from++)
            for (long j = 0; j < count; j++) {
                int64_t want = allgather_input(from, j, iter);
                if (recv[from * count + j] != want) mismatch(op, bytes, iter, from * count + j, recv[from * count + j], want);
            }
        break;
    }
}

static enum op parse_op(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, OP_NAMES[i]) == 0) return (enum op)i;
    fail("unknown op (allreduce, alltoall, allgather, reduce_scatter)");
    return ALLREDUCE;
}

/* This rank's gap (us) in each of `iters` iterations, from SCHEDULE. */
static long *read_schedule(const char *path, int iters) {
    long *gaps = calloc((size_t)iters, sizeof(long));
    char *seen = calloc((size_t)iters, 1);
    FILE *f = fopen(path, "r");
    if (!gaps || !seen || !f) fail("cannot read the schedule");
    char line[256];
    while (fgets(line, sizeof line, f)) {
        int it, r;
        long gap;
        if (sscanf(line, "%d,%d,%ld", &it, &r, &gap) == 3 && r == rank && it >= 0 && it < iters) {
            gaps[it] = gap;
            seen[it] = 1;
        }
    }
    fclose(f);
    for (int it = 0; it < iters; it++)
        if (!seen[it]) fail("the schedule has no gap for an iteration of this rank");
    free(seen);
    return gaps;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc != 7) fail("usage: collective_step OPS SIZES ITERS WARMUP SCHEDULE OUT");
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    if (iters <= 0 || warmup < 0) fail("ITERS must be > 0 and WARMUP >= 0");
    long *gaps = read_schedule(argv[5], iters);
    const char *recovery = getenv("XROCE_SELECTIVE_REPEAT");
    fprintf(stderr, "collective_step: rank %d: XROCE_SELECTIVE_REPEAT=%s\n", rank,
            recovery ? recovery : "unset");

    FILE *out = NULL, *progress = NULL;
    if (rank == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s.progress", argv[6]);
        out = fopen(argv[6], "w");
        progress = fopen(path, "w");
        if (!out || !progress) fail("cannot write OUT");
        fprintf(out, "op,bytes,iter,rank,gap_s,coll_s\n");
        fflush(out);
    }
    double *mine = malloc(sizeof(double) * 2 * (size_t)iters);
    double *all = rank == 0 ? malloc(sizeof(double) * 2 * (size_t)iters * (size_t)nranks) : NULL;
    if (!mine || (rank == 0 && !all)) fail("out of memory");

    long checked = 0;
    char *ops = strdup(argv[1]);
    for (char *op_name = strtok(ops, ","); op_name; op_name = strtok(NULL, ",")) {
        enum op op = parse_op(op_name);
        char *sizes = strdup(argv[2]), *save = NULL;
        for (char *size = strtok_r(sizes, ",", &save); size; size = strtok_r(NULL, ",", &save)) {
            long bytes = atol(size);
            long count = elements(op, bytes);
            if (count <= 0 || count > 0x7fffffffL) fail("a size is too small for this many ranks, or too large");
            long send_len = op == ALLREDUCE || op == ALLGATHER ? count : count * nranks;
            long recv_len = op == ALLREDUCE || op == REDUCE_SCATTER ? count : count * nranks;
            int64_t *send = malloc(sizeof(int64_t) * (size_t)send_len);
            int64_t *recv = malloc(sizeof(int64_t) * (size_t)recv_len);
            if (!send || !recv) fail("out of memory for the buffers");
            MPI_Barrier(MPI_COMM_WORLD); /* every case starts together */
            double last_exit = now_s();
            for (int k = -warmup; k < iters; k++) {
                int iter = k + warmup; /* the value's iteration: fresh data each call */
                fill(op, count, iter, send);
                memset(recv, 0xa5, sizeof(int64_t) * (size_t)recv_len);
                if (k >= 0) sleep_us(gaps[k]);
                double enter = now_s();
                run(op, count, send, recv);
                double exit_ = now_s();
                check(op, bytes, count, iter, recv);
                checked++;
                if (k >= 0) {
                    mine[2 * k] = enter - last_exit;
                    mine[2 * k + 1] = exit_ - enter;
                    if (rank == 0) {
                        fprintf(progress, "%s %ld %d\n", OP_NAMES[op], bytes, k);
                        fflush(progress);
                    }
                }
                last_exit = now_s();
            }
            /* Out of the timed loop: one gather per case. */
            MPI_Gather(mine, 2 * iters, MPI_DOUBLE, all, 2 * iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                long used = op == ALLREDUCE ? count * 8 : count * 8 * nranks;
                for (int k = 0; k < iters; k++)
                    for (int r = 0; r < nranks; r++)
                        fprintf(out, "%s,%ld,%d,%d,%.9f,%.9f\n", OP_NAMES[op], used, k, r,
                                all[(size_t)r * 2 * iters + 2 * k], all[(size_t)r * 2 * iters + 2 * k + 1]);
                fflush(out);
            }
            free(send);
            free(recv);
        }
        free(sizes);
    }
    long total = 0;
    MPI_Reduce(&checked, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        fclose(out);
        fclose(progress);
        printf("collective_step: ok: %d ranks, %ld results checked\n", nranks, total);
    }
    free(ops);
    free(gaps);
    free(mine);
    free(all);
    MPI_Finalize();
    return 0;
}
