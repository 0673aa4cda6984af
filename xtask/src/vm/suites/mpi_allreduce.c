/* MPI_Allreduce across the VM interop's ranks (xtask/src/vm/suites/mpi.rs).
 *
 * Every rank contributes values that depend on its rank and the element's
 * index; every rank checks every element of the result against the sum it
 * must be. Sizes from one element (UCX eager) to 1 MiB (rendezvous over
 * RDMA), SUM and MAX, and one MPI_IN_PLACE run. Exits non-zero (through
 * MPI_Abort) on the first wrong element; rank 0 prints one line per size.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int64_t value(int rank, long i) { return (int64_t)(rank + 1) * 1000003 + i % 7919; }

static void fail(int rank, const char *what, long n, long i, int64_t got, int64_t want) {
    fprintf(stderr, "allreduce FAILED: rank %d %s n=%ld element %ld: got %lld, want %lld\n", rank,
            what, n, i, (long long)got, (long long)want);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "allreduce: needs 2 ranks or more, got %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char host[MPI_MAX_PROCESSOR_NAME];
    int len;
    MPI_Get_processor_name(host, &len);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    const long sizes[] = {1, 1000, 131072}; /* 131072 x 8 bytes = 1 MiB */
    const int rounds = 3;
    int64_t *in = malloc(sizeof(int64_t) * 131072);
    int64_t *out = malloc(sizeof(int64_t) * 131072);
    if (!in || !out) {
        fprintf(stderr, "allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        long n = sizes[s];
        double t0 = MPI_Wtime();
        for (int r = 0; r < rounds; r++) {
            for (long i = 0; i < n; i++) {
                in[i] = value(rank, i) + r;
                out[i] = -1;
            }
            MPI_Allreduce(in, out, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            for (long i = 0; i < n; i++) {
                int64_t want = 0;
                for (int p = 0; p < size; p++)
                    want += value(p, i) + r;
                if (out[i] != want)
                    fail(rank, "SUM", n, i, out[i], want);
            }
            MPI_Allreduce(in, out, (int)n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
            for (long i = 0; i < n; i++) {
                int64_t want = value(size - 1, i) + r;
                if (out[i] != want)
                    fail(rank, "MAX", n, i, out[i], want);
            }
        }
        double secs = MPI_Wtime() - t0;
        if (rank == 0)
            printf("allreduce ok: %ld x int64 SUM+MAX x %d rounds in %.3f s\n", n, rounds, secs);
    }
    /* In place: each rank's buffer becomes the sum. */
    long n = 4096;
    for (long i = 0; i < n; i++)
        in[i] = value(rank, i);
    MPI_Allreduce(MPI_IN_PLACE, in, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        int64_t want = 0;
        for (int p = 0; p < size; p++)
            want += value(p, i);
        if (in[i] != want)
            fail(rank, "IN_PLACE SUM", n, i, in[i], want);
    }
    if (rank == 0)
        printf("allreduce ok: %ld x int64 MPI_IN_PLACE SUM\n", n);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
