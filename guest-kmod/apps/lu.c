// SPDX-License-Identifier: GPL-2.0
/*
 * lu: LU decomposition (no pivoting) of an N x N diagonally dominant
 * matrix of doubles in shared memory. Rows are dealt to nodes in blocks
 * of a page; at step k every node reads pivot row k and updates its rows
 * below it, then all meet at a barrier. With DSM_THREADS workers per
 * node, blocks are dealt to workers; a node initialises its workers' rows. Node 1 checks L and U against a
 * sequential run (same code: bit for bit).
 *
 * Usage: lu [N]
 */
#include <stdio.h>
#include <stdlib.h>
#include "../libdsm/libdsm.h"

static size_t N = 128, BLOCK = 4;

static double init_val(size_t i, size_t j)
{
	return i == j ? 2.0 * N : (double)((i * 31 + j * 17) % 97) / 97.0;
}

/* Eliminates column k from row i (the same code for both runs). */
static void lu_row(double *a, size_t k, size_t i)
{
	double *rk = a + k * N, *ri = a + i * N, l = ri[k] / rk[k];
	size_t j;

	ri[k] = l;
	for (j = k + 1; j < N; j++)
		ri[j] -= l * rk[j];
}

/* Row i's block is dealt to this worker. */
static int worker_mine(size_t i)
{
	return (i / BLOCK) % dsm_workers() == dsm_worker();
}

/* Row i's block is dealt to one of this node's workers. */
static int node_mine(size_t i)
{
	return (i / BLOCK) % dsm_workers() / dsm_threads() == dsm_self() - 1;
}

static void lu_worker(void *a)
{
	size_t i, k;

	for (k = 0; k + 1 < N; k++) {
		for (i = k + 1; i < N; i++)
			if (worker_mine(i))
				lu_row(a, k, i);
		dsm_barrier();
	}
}

int main(int argc, char **argv)
{
	size_t i, j, k;
	double *a, *ref, t0, ts = 0;
	int ok = -1;

	N = dsm_arg(argc, argv, 1, N);
	if (N < 2)
		dsm_die("matrix too small");
	dsm_init();
	/* A block of rows fills whole pages, so no two nodes write one page. */
	BLOCK = 4096 / (N * sizeof(double));
	if (!BLOCK)
		BLOCK = 1;
	a = dsm_alloc(N * N * sizeof(double));
	for (i = 0; i < N; i++)
		if (node_mine(i))
			for (j = 0; j < N; j++)
				a[i * N + j] = init_val(i, j);
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(lu_worker, a);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		ref = malloc(N * N * sizeof(double));
		for (i = 0; i < N; i++)
			for (j = 0; j < N; j++)
				ref[i * N + j] = init_val(i, j);
		ts = dsm_now();
		for (k = 0; k + 1 < N; k++)
			for (i = k + 1; i < N; i++)
				lu_row(ref, k, i);
		ts = dsm_now() - ts;
		ok = 1;
		for (i = 0; i < N * N && ok; i++)
			ok = a[i] == ref[i];
		if (!ok)
			fprintf(stderr, "lu: mismatch at %zu\n", i - 1);
		free(ref);
	}
	dsm_report("lu", ok, t0, ts, NULL);
	return ok == 0;
}
