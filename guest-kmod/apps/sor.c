// SPDX-License-Identifier: GPL-2.0
/*
 * sor: red-black successive over-relaxation on a ROWS x COLS grid of
 * floats in shared memory; each node owns a band of rows and reads its
 * neighbours' boundary rows. Node 1 checks the grid against a sequential
 * run (the same code, so the floats must match bit for bit). With
 * DSM_THREADS workers per node, each worker owns a band of its node's.
 *
 * Usage: sor [ROWS [COLS [ITERS]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

#define OMEGA 1.25f

static size_t R = 130, C = 1024, ITERS = 10;

static float init_val(size_t i, size_t j)
{
	if (i == 0 || j == 0 || i == R - 1 || j == C - 1)
		return (float)((i * 7 + j * 3) % 100) / 10.0f;
	return 0.0f;
}

/* One color's update of row i (the same code for the DSM and the sequential run). */
static void sor_row(float *g, size_t i, int color)
{
	float *up = g + (i - 1) * C, *row = g + i * C, *down = g + (i + 1) * C;
	size_t j;

	for (j = 1 + (i + color) % 2; j < C - 1; j += 2)
		row[j] = OMEGA / 4 * (up[j] + down[j] + row[j - 1] + row[j + 1]) +
			 (1 - OMEGA) * row[j];
}

static void sor(float *g, size_t lo, size_t hi, int shared)
{
	size_t it, i;
	int color;

	for (it = 0; it < ITERS; it++)
		for (color = 0; color < 2; color++) {
			for (i = lo; i < hi; i++)
				sor_row(g, i, color);
			if (shared)
				dsm_barrier();
		}
}

/* A worker's share of the DSM run. */
static void sor_worker(void *g)
{
	size_t lo, hi;

	dsm_range(R - 2, &lo, &hi);
	sor(g, lo + 1, hi + 1, 1);
}

int main(int argc, char **argv)
{
	size_t lo, hi, i, j;
	float *g, *ref;
	int ok = -1;
	double t0, ts = 0;

	R = dsm_arg(argc, argv, 1, R);
	C = dsm_arg(argc, argv, 2, C);
	ITERS = dsm_arg(argc, argv, 3, ITERS);
	if (R < 3 || C < 3)
		dsm_die("grid too small");
	dsm_init();
	g = dsm_alloc(R * C * sizeof(float));
	dsm_range(R, &lo, &hi);
	for (i = lo; i < hi; i++)
		for (j = 0; j < C; j++)
			g[i * C + j] = init_val(i, j);
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(sor_worker, g);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		ref = malloc(R * C * sizeof(float));
		for (i = 0; i < R; i++)
			for (j = 0; j < C; j++)
				ref[i * C + j] = init_val(i, j);
		ts = dsm_now();
		sor(ref, 1, R - 1, 0);
		ts = dsm_now() - ts;
		ok = 1;
		for (i = 0; i < R * C && ok; i++)
			ok = g[i] == ref[i];
		if (!ok)
			fprintf(stderr, "sor: mismatch at row %zu col %zu\n",
				(i - 1) / C, (i - 1) % C);
		free(ref);
	}
	dsm_report("sor", ok, t0, ts, NULL);
	return ok == 0;
}
