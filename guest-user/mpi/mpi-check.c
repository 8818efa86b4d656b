// SPDX-License-Identifier: GPL-2.0
/*
 * mpi-check: an MPI program whose every result is checked, for hcabench's
 * `mpirun` across guests (docs/guides/mpi.md).
 *
 * Each rank does, and checks:
 *  - a ring: sends a buffer of a rank- and size-dependent pattern to the next
 *    rank and checks the one from the previous rank, byte by byte, for sizes
 *    from 1 byte to 1 MiB (eager and rendezvous protocols both);
 *  - an allreduce: the sum of i * i over 0 <= i < n, each rank summing its own
 *    share, against the closed form n (n - 1) (2n - 1) / 6;
 *  - a broadcast from the last rank, checked on every rank;
 *  - a 1-D Jacobi relaxation split across the ranks with halo exchange,
 *    against the same relaxation done sequentially on rank 0.
 *
 * Prints "MPI-CHECK OK ranks=N ..." on rank 0 when all passed on all ranks;
 * exits 1 (every rank) when any check failed anywhere.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MSG (1 << 20)
#define SUM_N 1000003LL
#define JACOBI_N 4096
#define JACOBI_ITERS 200

static int rank, size;

static unsigned char pattern(int from, size_t len, size_t i)
{
	return (unsigned char)(from * 131 + len * 7 + i * 13);
}

static int check_ring(void)
{
	unsigned char *out = malloc(MAX_MSG), *in = malloc(MAX_MSG);
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	int bad = 0;
	size_t len, i;

	if (!out || !in)
		return 1;
	for (len = 1; len <= MAX_MSG; len *= 4) {
		for (i = 0; i < len; i++)
			out[i] = pattern(rank, len, i);
		memset(in, 0, len);
		MPI_Sendrecv(out, (int)len, MPI_BYTE, next, 1, in, (int)len,
			     MPI_BYTE, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (i = 0; i < len; i++) {
			if (in[i] != pattern(prev, len, i)) {
				fprintf(stderr,
					"rank %d: ring: %zu-byte message from %d: byte %zu is %u, not %u\n",
					rank, len, prev, i, in[i],
					pattern(prev, len, i));
				bad = 1;
				break;
			}
		}
	}
	free(out);
	free(in);
	return bad;
}

static int check_allreduce(long long *total)
{
	long long mine = 0, want = SUM_N * (SUM_N - 1) * (2 * SUM_N - 1) / 6;
	long long i;

	for (i = rank; i < SUM_N; i += size)
		mine += i * i;
	MPI_Allreduce(&mine, total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (*total != want) {
		fprintf(stderr, "rank %d: allreduce: %lld, not %lld\n", rank,
			*total, want);
		return 1;
	}
	return 0;
}

static int check_bcast(void)
{
	int buf[256], i, root = size - 1;

	for (i = 0; i < 256; i++)
		buf[i] = rank == root ? i * 17 + root : -1;
	MPI_Bcast(buf, 256, MPI_INT, root, MPI_COMM_WORLD);
	for (i = 0; i < 256; i++) {
		if (buf[i] != i * 17 + root) {
			fprintf(stderr, "rank %d: bcast: element %d is %d\n",
				rank, i, buf[i]);
			return 1;
		}
	}
	return 0;
}

/* One sweep of u[1..n-2] = (u[i-1] + u[i+1]) / 2 from old into new. */
static void sweep(const double *old, double *new, int lo, int hi)
{
	int i;

	for (i = lo; i < hi; i++)
		new[i] = 0.5 * (old[i - 1] + old[i + 1]);
}

static void jacobi_init(double *u, int n)
{
	int i;

	for (i = 0; i < n; i++)
		u[i] = (i * 37 % 101) / 101.0;
	u[0] = 1.0;
	u[n - 1] = -1.0;
}

/*
 * The relaxation over the ranks: rank r holds cells [lo, hi) of the interior
 * plus one halo cell each side, exchanged every sweep. The result is gathered
 * to rank 0 and compared, exactly, with the sequential one (the same
 * arithmetic in the same order, so the doubles agree bit for bit).
 */
static int check_jacobi(double *maxdiff)
{
	int n = JACOBI_N, interior = n - 2, it, i, bad = 0;
	int share = interior / size, extra = interior % size;
	int lo = 1 + rank * share + (rank < extra ? rank : extra);
	int hi = lo + share + (rank < extra ? 1 : 0);
	double *u = malloc(n * sizeof(*u)), *v = malloc(n * sizeof(*v));
	int *counts = malloc(size * sizeof(int)), *displs = malloc(size * sizeof(int));
	double *seq = NULL, *par = NULL, *tmp;

	if (!u || !v || !counts || !displs)
		return 1;
	jacobi_init(u, n);
	memcpy(v, u, n * sizeof(*u));
	for (it = 0; it < JACOBI_ITERS; it++) {
		int up = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
		int down = rank > 0 ? rank - 1 : MPI_PROC_NULL;

		MPI_Sendrecv(&u[hi - 1], 1, MPI_DOUBLE, up, 2, &u[lo - 1], 1,
			     MPI_DOUBLE, down, 2, MPI_COMM_WORLD,
			     MPI_STATUS_IGNORE);
		MPI_Sendrecv(&u[lo], 1, MPI_DOUBLE, down, 3, &u[hi], 1,
			     MPI_DOUBLE, up, 3, MPI_COMM_WORLD,
			     MPI_STATUS_IGNORE);
		sweep(u, v, lo, hi);
		tmp = u;
		u = v;
		v = tmp;
	}
	for (i = 0; i < size; i++) {
		counts[i] = share + (i < extra ? 1 : 0);
		displs[i] = 1 + i * share + (i < extra ? i : extra);
	}
	if (rank == 0) {
		par = malloc(n * sizeof(*par));
		seq = malloc(n * sizeof(*seq));
		tmp = malloc(n * sizeof(*tmp));
		if (!par || !seq || !tmp)
			return 1;
		jacobi_init(par, n);
		jacobi_init(seq, n);
		memcpy(tmp, seq, n * sizeof(*seq));
		for (it = 0; it < JACOBI_ITERS; it++) {
			double *t;

			sweep(seq, tmp, 1, n - 1);
			t = seq;
			seq = tmp;
			tmp = t;
		}
		free(tmp);
	}
	MPI_Gatherv(&u[lo], hi - lo, MPI_DOUBLE, par, counts, displs,
		    MPI_DOUBLE, 0, MPI_COMM_WORLD);
	*maxdiff = 0;
	if (rank == 0) {
		for (i = 0; i < n; i++) {
			double d = par[i] - seq[i];

			if (d < 0)
				d = -d;
			if (d > *maxdiff)
				*maxdiff = d;
		}
		if (*maxdiff != 0) {
			fprintf(stderr,
				"jacobi: parallel and sequential differ by %g\n",
				*maxdiff);
			bad = 1;
		}
		free(par);
		free(seq);
	}
	free(u);
	free(v);
	free(counts);
	free(displs);
	return bad;
}

int main(int argc, char **argv)
{
	char host[MPI_MAX_PROCESSOR_NAME];
	long long total = 0;
	double t0, maxdiff = 0;
	int len, bad = 0, anybad = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Get_processor_name(host, &len);
	printf("rank %d of %d on %s\n", rank, size, host);
	fflush(stdout);
	t0 = MPI_Wtime();
	bad |= check_ring();
	bad |= check_allreduce(&total);
	bad |= check_bcast();
	bad |= check_jacobi(&maxdiff);
	MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
	if (rank == 0) {
		if (anybad)
			printf("MPI-CHECK FAILED ranks=%d\n", size);
		else
			printf("MPI-CHECK OK ranks=%d sum=%lld jacobi=%dx%d seconds=%.3f\n",
			       size, total, JACOBI_N, JACOBI_ITERS,
			       MPI_Wtime() - t0);
	}
	MPI_Finalize();
	return anybad ? 1 : 0;
}
