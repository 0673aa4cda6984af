/*
 * Collectives and one-sided communication with every result checked:
 * MPI_Allreduce, MPI_Alltoall, MPI_Bcast, and MPI_Put / MPI_Get in a window
 * (MPI_Win_create with fence epochs, then a passive-target lock epoch).
 * Each rank's data depends on its rank and on the element index, so a
 * misplaced, stale or lost element shows.
 *
 * Usage: mpi_collectives [ELEMENTS]   (default 65536 ints per buffer; with
 * more than a few KiB UCX takes its rendezvous path: RDMA READ / WRITE).
 * Prints "rank R of N: ok (uid U)" per rank and exits 0; on the first mismatch it
 * prints what and where and calls MPI_Abort (exit status non-zero).
 * Built by tests/tests/openmpi.rs with mpicc.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static void fail(const char *what, long index, long got, long want)
{
	fprintf(stderr, "rank %d: %s mismatch at %ld: got %ld, want %ld\n", rank, what,
		index, got, want);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 2);
	exit(2);
}

/* The value rank r contributes at index i. */
static int32_t value(int r, long i)
{
	return (int32_t)((r + 1) * 1000003L + i * 7 + (i >> 10));
}

static void check_allreduce(long n)
{
	int32_t *in = malloc(n * sizeof(*in)), *out = malloc(n * sizeof(*out));
	for (long i = 0; i < n; i++)
		in[i] = value(rank, i);
	MPI_Allreduce(in, out, (int)n, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
	for (long i = 0; i < n; i++) {
		int64_t want = 0;
		for (int r = 0; r < size; r++)
			want += value(r, i);
		if (out[i] != (int32_t)want)
			fail("MPI_Allreduce", i, out[i], (int32_t)want);
	}
	free(in);
	free(out);
}

static void check_alltoall(long n)
{
	/* Block b of rank r's send buffer goes to rank b. */
	long per = n / size > 0 ? n / size : 1;
	int32_t *in = malloc(per * size * sizeof(*in)), *out = malloc(per * size * sizeof(*out));
	for (int b = 0; b < size; b++)
		for (long i = 0; i < per; i++)
			in[b * per + i] = value(rank, i) ^ (b << 20);
	MPI_Alltoall(in, (int)per, MPI_INT32_T, out, (int)per, MPI_INT32_T, MPI_COMM_WORLD);
	for (int src = 0; src < size; src++)
		for (long i = 0; i < per; i++) {
			int32_t want = value(src, i) ^ (rank << 20);
			if (out[src * per + i] != want)
				fail("MPI_Alltoall", src * per + i, out[src * per + i], want);
		}
	free(in);
	free(out);
}

static void check_bcast(long n)
{
	int32_t *buf = malloc(n * sizeof(*buf));
	for (int root = 0; root < size; root++) {
		for (long i = 0; i < n; i++)
			buf[i] = rank == root ? value(root, i) : -1;
		MPI_Bcast(buf, (int)n, MPI_INT32_T, root, MPI_COMM_WORLD);
		for (long i = 0; i < n; i++)
			if (buf[i] != value(root, i))
				fail("MPI_Bcast", i, buf[i], value(root, i));
	}
	free(buf);
}

/*
 * Every rank exposes `n` ints. Fence epoch: each rank puts its values into
 * the next rank's window at offset 0 and gets the previous rank's first
 * block. Lock epoch: each rank writes a marked block into the next rank
 * with an exclusive lock, flushes, reads it back with MPI_Get.
 */
static void check_one_sided(long n)
{
	int32_t *base, *mine = malloc(n * sizeof(*mine)), *got = malloc(n * sizeof(*got));
	MPI_Win win;
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;

	MPI_Alloc_mem(n * sizeof(*base), MPI_INFO_NULL, &base);
	for (long i = 0; i < n; i++) {
		base[i] = value(rank, i) ^ 0x5a5a;
		mine[i] = value(rank, i);
	}
	MPI_Win_create(base, n * sizeof(*base), sizeof(*base), MPI_INFO_NULL, MPI_COMM_WORLD,
		       &win);

	/* Fence epoch 1: get the previous rank's initial contents. */
	MPI_Win_fence(0, win);
	MPI_Get(got, (int)n, MPI_INT32_T, prev, 0, (int)n, MPI_INT32_T, win);
	MPI_Win_fence(0, win);
	for (long i = 0; i < n; i++)
		if (got[i] != (value(prev, i) ^ 0x5a5a))
			fail("MPI_Get (fence)", i, got[i], value(prev, i) ^ 0x5a5a);

	/* Fence epoch 2: put ours into the next rank's window. */
	MPI_Put(mine, (int)n, MPI_INT32_T, next, 0, (int)n, MPI_INT32_T, win);
	MPI_Win_fence(0, win);
	for (long i = 0; i < n; i++)
		if (base[i] != value(prev, i))
			fail("MPI_Put (fence)", i, base[i], value(prev, i));

	/* Passive target: exclusive lock on the next rank, put, flush, get. */
	for (long i = 0; i < n; i++)
		mine[i] = value(rank, i) + 17;
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Win_lock(MPI_LOCK_EXCLUSIVE, next, 0, win);
	MPI_Put(mine, (int)n, MPI_INT32_T, next, 0, (int)n, MPI_INT32_T, win);
	MPI_Win_flush(next, win);
	memset(got, 0, n * sizeof(*got));
	MPI_Get(got, (int)n, MPI_INT32_T, next, 0, (int)n, MPI_INT32_T, win);
	MPI_Win_unlock(next, win);
	for (long i = 0; i < n; i++)
		if (got[i] != value(rank, i) + 17)
			fail("MPI_Get (lock)", i, got[i], value(rank, i) + 17);
	MPI_Barrier(MPI_COMM_WORLD);
	/* Our own window now holds what the previous rank put. */
	MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
	for (long i = 0; i < n; i++)
		if (base[i] != value(prev, i) + 17)
			fail("MPI_Put (lock)", i, base[i], value(prev, i) + 17);
	MPI_Win_unlock(rank, win);

	MPI_Win_free(&win);
	MPI_Free_mem(base);
	free(mine);
	free(got);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 65536;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (n <= 0) {
		if (rank == 0)
			fprintf(stderr, "ELEMENTS must be positive, got %s\n", argv[1]);
		MPI_Finalize();
		return 1;
	}
	/* A small size (eager path) and the given one (rendezvous path). */
	long sizes[] = {7, n};
	for (int s = 0; s < 2; s++) {
		check_allreduce(sizes[s]);
		check_alltoall(sizes[s] * size);
		check_bcast(sizes[s]);
		check_one_sided(sizes[s]);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	printf("rank %d of %d: ok (uid %u)\n", rank, size, (unsigned)getuid());
	fflush(stdout);
	MPI_Finalize();
	return 0;
}
