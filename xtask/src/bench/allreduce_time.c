/* MPI_Allreduce timing for `cargo xtask bench` (xtask/src/bench/clients.rs).
 *
 * usage: allreduce_time BYTES ITERATIONS
 *
 * One untimed call, then ITERATIONS calls of MPI_Allreduce (SUM of int64)
 * on BYTES bytes, between barriers. Every rank checks every element of the
 * last result (a wrong sum aborts: a fast wrong answer is no figure).
 * Rank 0 prints `allreduce_seconds S`, the mean time of one call.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int64_t value(int rank, long i, int round) {
    return (int64_t)(rank + 1) * 1000003 + i % 7919 + round;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3) {
        if (rank == 0) fprintf(stderr, "usage: allreduce_time BYTES ITERATIONS\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    long n = atol(argv[1]) / (long)sizeof(int64_t);
    int iterations = atoi(argv[2]);
    int64_t *in = malloc(sizeof(int64_t) * n);
    int64_t *out = malloc(sizeof(int64_t) * n);
    if (n <= 0 || iterations <= 0 || !in || !out) {
        fprintf(stderr, "allreduce_time: bad size or out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double elapsed = 0;
    for (int round = 0; round <= iterations; round++) {
        for (long i = 0; i < n; i++) in[i] = value(rank, i, round);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(in, out, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0;
        if (round > 0) elapsed += t; /* round 0 connects the ranks */
    }
    for (long i = 0; i < n; i++) {
        int64_t want = 0;
        for (int r = 0; r < size; r++) want += value(r, i, iterations);
        if (out[i] != want) {
            fprintf(stderr, "allreduce_time: rank %d element %ld: got %lld, want %lld\n", rank,
                    i, (long long)out[i], (long long)want);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    /* The slowest rank's time is the collective's. */
    double slowest;
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("allreduce_seconds %.6f\n", slowest / iterations);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
