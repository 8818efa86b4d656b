// SPDX-License-Identifier: GPL-2.0
/*
 * nbodyw: n-body steps with write sharing, the paper's NbodyW.
 *
 * The paper's suite (its reference [17]) has two n-body programs, Nbody and
 * NbodyW, and NbodyW scales far worse (Table 2: 3.1-3.7 against 6.8-11 on 8
 * hosts). The suite's source is not at hand; what the name and those numbers
 * point to, and what is implemented here, is the classic write-sharing
 * formulation: every pair of bodies is computed once (Newton's third law),
 * so a node's pairs push forces onto bodies that other nodes own. Each node
 * sums its pairs' forces privately, then adds them into the shared force
 * array block by block under that block's DSM lock, so every node writes
 * every page of the force array every step (Nbody, by contrast, writes only
 * its own bodies). Rows of the pair triangle go to nodes cyclically, for
 * balance; the owners then move their bodies. With DSM_THREADS workers
 * per node, each worker plays the part of a node above (its own rows, its
 * own private sums), so "node" below reads "worker".
 *
 * Verification: node 1 replays every node's private sums exactly (same
 * rows, same order: bit for bit the same numbers) and adds them in node
 * order. The DSM run adds the same per-node sums in lock order instead, so
 * each force component may differ by rounding: for N nodes at most
 * (N - 1) * 2^-53 times the sum of the partial magnitudes. Over a few steps
 * that stays near 1e-13 relative; the check allows 1e-9 relative (plus
 * 1e-12 absolute), six orders of magnitude above rounding and far below
 * what one missing or doubled contribution changes (1e-3 and more).
 *
 * Usage: nbodyw [BODIES [STEPS]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

struct body {
	double x, y, z, m;
};

struct vec {
	double x, y, z;
};

static size_t NB = 256, STEPS = 3;
static unsigned BLOCKS;

#define DT	0.01
#define EPS2	0.01

static void init(struct body *p, struct vec *v, size_t i)
{
	p[i].x = (double)((i * 37) % 101) - 50;
	p[i].y = (double)((i * 53) % 103) - 51;
	p[i].z = (double)((i * 71) % 107) - 53;
	p[i].m = 1.0 + (double)(i % 7);
	v[i].x = v[i].y = v[i].z = 0;
}

/* Node k's (1..n) forces from its rows of the pair triangle, into buf. */
static void pairs(const struct body *p, struct vec *buf, unsigned k, unsigned n)
{
	size_t i, j;
	double dx, dy, dz, r2, f;

	memset(buf, 0, NB * sizeof(*buf));
	for (i = k - 1; i < NB; i += n) {
		for (j = i + 1; j < NB; j++) {
			dx = p[j].x - p[i].x;
			dy = p[j].y - p[i].y;
			dz = p[j].z - p[i].z;
			r2 = dx * dx + dy * dy + dz * dz + EPS2;
			f = p[i].m * p[j].m / (r2 * sqrt(r2));
			buf[i].x += f * dx;
			buf[i].y += f * dy;
			buf[i].z += f * dz;
			buf[j].x -= f * dx;
			buf[j].y -= f * dy;
			buf[j].z -= f * dz;
		}
	}
}

static void move(struct body *p, struct vec *v, const struct vec *f, size_t i)
{
	v[i].x += f[i].x / p[i].m * DT;
	v[i].y += f[i].y / p[i].m * DT;
	v[i].z += f[i].z / p[i].m * DT;
	p[i].x += v[i].x * DT;
	p[i].y += v[i].y * DT;
	p[i].z += v[i].z * DT;
}

static int close_to(double a, double b)
{
	return fabs(a - b) <= 1e-12 + 1e-9 * fmax(fabs(a), fabs(b));
}

/* The sequential run, with every node's sums replayed and added in node order. */
static void sequential(struct body *p, struct vec *v, unsigned n)
{
	struct vec *f = calloc(NB, sizeof(*f)), *buf = malloc(NB * sizeof(*buf));
	size_t i, s;
	unsigned k;

	if (!f || !buf)
		dsm_die("nbodyw: out of memory");
	for (s = 0; s < STEPS; s++) {
		memset(f, 0, NB * sizeof(*f));
		for (k = 1; k <= n; k++) {
			pairs(p, buf, k, n);
			for (i = 0; i < NB; i++) {
				f[i].x += buf[i].x;
				f[i].y += buf[i].y;
				f[i].z += buf[i].z;
			}
		}
		for (i = 0; i < NB; i++)
			move(p, v, f, i);
	}
	free(f);
	free(buf);
}

static struct body *pos;
static struct vec *vel, *force;

static void nbodyw_worker(void *unused)
{
	struct vec *buf = malloc(NB * sizeof(*buf));
	unsigned me = dsm_worker() + 1, n = dsm_workers(), b, bl;
	size_t per = (NB + BLOCKS - 1) / BLOCKS, lo, hi, i, s;

	if (!buf)
		dsm_die("nbodyw: out of memory");
	dsm_range(NB, &lo, &hi);
	for (s = 0; s < STEPS; s++) {
		for (i = lo; i < hi; i++)
			force[i].x = force[i].y = force[i].z = 0;
		dsm_barrier();
		pairs(pos, buf, me, n);
		/* Every worker adds into every block; each starts at its own. */
		for (b = 0; b < BLOCKS; b++) {
			bl = (b + (me - 1) * BLOCKS / n) % BLOCKS;
			dsm_lock(bl);
			for (i = bl * per; i < NB && i < (bl + 1) * per; i++) {
				force[i].x += buf[i].x;
				force[i].y += buf[i].y;
				force[i].z += buf[i].z;
			}
			dsm_unlock(bl);
		}
		dsm_barrier();
		for (i = lo; i < hi; i++)
			move(pos, vel, force, i);
		dsm_barrier();
	}
	free(buf);
}

int main(int argc, char **argv)
{
	struct body *rp;
	struct vec *rv;
	size_t lo, hi, i;
	int ok = -1;
	double t0, ts = 0;

	NB = dsm_arg(argc, argv, 1, NB);
	STEPS = dsm_arg(argc, argv, 2, STEPS);
	dsm_init();
	BLOCKS = NB < DSM_LOCKS ? (unsigned)NB : DSM_LOCKS;
	pos = dsm_alloc(NB * sizeof(*pos));
	vel = dsm_alloc(NB * sizeof(*vel));
	force = dsm_alloc(NB * sizeof(*force));
	dsm_range(NB, &lo, &hi);
	for (i = lo; i < hi; i++)
		init(pos, vel, i);
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(nbodyw_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		rp = malloc(NB * sizeof(*rp));
		rv = malloc(NB * sizeof(*rv));
		if (!rp || !rv)
			dsm_die("nbodyw: out of memory");
		for (i = 0; i < NB; i++)
			init(rp, rv, i);
		ts = dsm_now();
		sequential(rp, rv, dsm_workers());
		ts = dsm_now() - ts;
		ok = 1;
		for (i = 0; i < NB && ok; i++)
			ok = close_to(pos[i].x, rp[i].x) && close_to(pos[i].y, rp[i].y) &&
			     close_to(pos[i].z, rp[i].z) && close_to(vel[i].x, rv[i].x) &&
			     close_to(vel[i].y, rv[i].y) && close_to(vel[i].z, rv[i].z);
		if (!ok)
			fprintf(stderr, "nbodyw: body %zu off: %.17g vs %.17g\n", i - 1,
				pos[i - 1].x, rp[i - 1].x);
	}
	dsm_report("nbodyw", ok, t0, ts, NULL);
	return ok == 0;
}
