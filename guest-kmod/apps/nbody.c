// SPDX-License-Identifier: GPL-2.0
/*
 * nbody: direct O(n^2) gravitational n-body steps. Positions are double
 * buffered in shared memory; each node moves its share of the bodies,
 * reading every body's position, then all meet at a barrier. Node 1
 * checks positions and velocities against a sequential run (bit for bit).
 * With DSM_THREADS workers per node, each worker moves its share.
 *
 * Usage: nbody [BODIES [STEPS]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

struct body {
	double x, y, z, m;
};

struct vel {
	double x, y, z;
};

static size_t NB = 256, STEPS = 4;

#define DT	0.01
#define EPS2	0.01

static void init(struct body *p, struct vel *v, size_t i)
{
	p[i].x = (double)((i * 37) % 101) - 50;
	p[i].y = (double)((i * 53) % 103) - 51;
	p[i].z = (double)((i * 71) % 107) - 53;
	p[i].m = 1.0 + (double)(i % 7);
	v[i].x = v[i].y = v[i].z = 0;
}

/* Body i's step from src to dst (the same code for both runs). */
static void move(const struct body *src, struct body *dst, struct vel *v, size_t i)
{
	double ax = 0, ay = 0, az = 0, dx, dy, dz, r2, f;
	size_t j;

	for (j = 0; j < NB; j++) {
		if (j == i)
			continue;
		dx = src[j].x - src[i].x;
		dy = src[j].y - src[i].y;
		dz = src[j].z - src[i].z;
		r2 = dx * dx + dy * dy + dz * dz + EPS2;
		f = src[j].m / (r2 * sqrt(r2));
		ax += f * dx;
		ay += f * dy;
		az += f * dz;
	}
	v[i].x += ax * DT;
	v[i].y += ay * DT;
	v[i].z += az * DT;
	dst[i] = src[i];
	dst[i].x += v[i].x * DT;
	dst[i].y += v[i].y * DT;
	dst[i].z += v[i].z * DT;
}

static struct body *pos[2];
static struct vel *vel;

static void nbody_worker(void *unused)
{
	size_t lo, hi, i, s;

	dsm_range(NB, &lo, &hi);
	for (s = 0; s < STEPS; s++) {
		for (i = lo; i < hi; i++)
			move(pos[s % 2], pos[(s + 1) % 2], vel, i);
		dsm_barrier();
	}
}

int main(int argc, char **argv)
{
	struct body *rp[2];
	struct vel *rv;
	size_t lo, hi, i, s;
	int ok = -1;
	double t0, ts = 0;

	NB = dsm_arg(argc, argv, 1, NB);
	STEPS = dsm_arg(argc, argv, 2, STEPS);
	dsm_init();
	pos[0] = dsm_alloc(NB * sizeof(struct body));
	pos[1] = dsm_alloc(NB * sizeof(struct body));
	vel = dsm_alloc(NB * sizeof(struct vel));
	dsm_range(NB, &lo, &hi);
	for (i = lo; i < hi; i++)
		init(pos[0], vel, i);
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(nbody_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		rp[0] = malloc(NB * sizeof(struct body));
		rp[1] = malloc(NB * sizeof(struct body));
		rv = malloc(NB * sizeof(struct vel));
		for (i = 0; i < NB; i++)
			init(rp[0], rv, i);
		ts = dsm_now();
		for (s = 0; s < STEPS; s++)
			for (i = 0; i < NB; i++)
				move(rp[s % 2], rp[(s + 1) % 2], rv, i);
		ts = dsm_now() - ts;
		ok = 1;
		for (i = 0; i < NB && ok; i++)
			ok = !memcmp(&pos[STEPS % 2][i], &rp[STEPS % 2][i],
				     sizeof(struct body)) &&
			     !memcmp(&vel[i], &rv[i], sizeof(struct vel));
		if (!ok)
			fprintf(stderr, "nbody: mismatch at body %zu\n", i - 1);
	}
	dsm_report("nbody", ok, t0, ts, NULL);
	return ok == 0;
}
