// SPDX-License-Identifier: GPL-2.0
/*
 * water: molecular dynamics of water molecules after SPLASH-2's
 * water-nsquared. Each molecule is an oxygen and two hydrogens with point
 * charges (SPC's -0.82 and +0.41); bonds O-H and H-H are springs (the
 * intra-molecular forces); between molecules whose oxygens are closer than
 * the cutoff radius, the oxygens feel Lennard-Jones and all nine atom pairs
 * Coulomb (the inter-molecular forces). As in water-nsquared, each node owns
 * a block of molecules (it computes their intra-molecular forces and moves
 * them), the O(n^2) pair work is shared out (here rows of the pair triangle,
 * cyclically, so every pair is computed once), and each node adds the
 * forces of its pairs into the shared force array under per-block DSM
 * locks, which makes the force array write-shared by every node. Steps are
 * symplectic Euler (kick, then drift) rather than water-nsquared's
 * sixth-order predictor-corrector: the sharing pattern, not the integrator,
 * is what the DSM sees.
 *
 * Verification, as for nbodyw: node 1 replays every node's pair sums bit
 * for bit and adds them in node order; the DSM run adds the same sums in
 * lock order, so forces differ only by rounding, (N - 1) * 2^-53 relative
 * to the partial sums; the check allows 1e-9 relative plus 1e-12 absolute
 * over a few steps, far above rounding and far below any lost or doubled
 * contribution.
 *
 * With DSM_THREADS workers per node, each worker plays the part of a node
 * above (its block, its rows, its private sums).
 *
 * Usage: water [MOLECULES [STEPS]]  (MOLECULES a cube is best: 64, 125, 216)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

/* One molecule: atoms 0 (O), 1 and 2 (H), each x, y, z. */
struct mol {
	double a[3][3];
};

static size_t NM = 64, STEPS = 3;

#define DT		0.0005
#define CUTOFF2		(6.5 * 6.5)
#define SPACING		3.1
#define K_OH		450.0	/* bond springs, O-H and H-H */
#define R_OH		1.0
#define K_HH		55.0
#define R_HH		1.633
#define LJ_EPS		0.155
#define LJ_SIG		3.166
#define COULOMB		332.06

static const double mass[3] = { 15.999, 1.008, 1.008 };
static const double charge[3] = { -0.82, 0.41, 0.41 };

static void init(struct mol *p, struct mol *v, size_t m)
{
	size_t side = 1;
	double o[3], t;
	int k;

	while (side * side * side < NM)
		side++;
	o[0] = SPACING * (double)(m % side);
	o[1] = SPACING * (double)(m / side % side);
	o[2] = SPACING * (double)(m / side / side);
	t = 0.7 * (double)(m % 9);	/* orientation of the H-O-H plane */
	for (k = 0; k < 3; k++)
		p[m].a[0][k] = o[k];
	p[m].a[1][0] = o[0] + R_OH * cos(t);
	p[m].a[1][1] = o[1] + R_OH * sin(t);
	p[m].a[1][2] = o[2];
	p[m].a[2][0] = o[0] + R_OH * cos(t + 1.911);
	p[m].a[2][1] = o[1] + R_OH * sin(t + 1.911);
	p[m].a[2][2] = o[2] + 0.1 * (double)(m % 3);
	memset(&v[m], 0, sizeof(v[m]));
}

/* A spring between atoms i and j of molecule m. */
static void spring(const struct mol *p, struct mol *f, size_t m, int i, int j,
		   double k, double r0)
{
	double d[3], r = 0, s;
	int c;

	for (c = 0; c < 3; c++) {
		d[c] = p[m].a[j][c] - p[m].a[i][c];
		r += d[c] * d[c];
	}
	r = sqrt(r);
	s = k * (r - r0) / r;
	for (c = 0; c < 3; c++) {
		f[m].a[i][c] += s * d[c];
		f[m].a[j][c] -= s * d[c];
	}
}

static void intra(const struct mol *p, struct mol *f, size_t m)
{
	spring(p, f, m, 0, 1, K_OH, R_OH);
	spring(p, f, m, 0, 2, K_OH, R_OH);
	spring(p, f, m, 1, 2, K_HH, R_HH);
}

/* Molecules m and n, if their oxygens are within the cutoff: LJ and Coulomb. */
static void inter(const struct mol *p, struct mol *f, size_t m, size_t n)
{
	double d[3], r2 = 0, s, sr6;
	int i, j, c;

	for (c = 0; c < 3; c++) {
		d[c] = p[n].a[0][c] - p[m].a[0][c];
		r2 += d[c] * d[c];
	}
	if (r2 > CUTOFF2)
		return;
	sr6 = pow(LJ_SIG * LJ_SIG / r2, 3);
	s = -24 * LJ_EPS * (2 * sr6 * sr6 - sr6) / r2;
	for (c = 0; c < 3; c++) {
		f[m].a[0][c] += s * d[c];
		f[n].a[0][c] -= s * d[c];
	}
	for (i = 0; i < 3; i++) {
		for (j = 0; j < 3; j++) {
			double e[3], q2 = 0;

			for (c = 0; c < 3; c++) {
				e[c] = p[n].a[j][c] - p[m].a[i][c];
				q2 += e[c] * e[c];
			}
			s = -COULOMB * charge[i] * charge[j] / (q2 * sqrt(q2));
			for (c = 0; c < 3; c++) {
				f[m].a[i][c] += s * e[c];
				f[n].a[j][c] -= s * e[c];
			}
		}
	}
}

/* Node k's (1..nodes) inter-molecular forces from its rows of the pair triangle. */
static void pairs(const struct mol *p, struct mol *buf, unsigned k, unsigned nodes)
{
	size_t m, n;

	memset(buf, 0, NM * sizeof(*buf));
	for (m = k - 1; m < NM; m += nodes)
		for (n = m + 1; n < NM; n++)
			inter(p, buf, m, n);
}

static void move(struct mol *p, struct mol *v, const struct mol *f, size_t m)
{
	int i, c;

	for (i = 0; i < 3; i++) {
		for (c = 0; c < 3; c++) {
			v[m].a[i][c] += f[m].a[i][c] / mass[i] * DT;
			p[m].a[i][c] += v[m].a[i][c] * DT;
		}
	}
}

static void add(struct mol *to, const struct mol *from)
{
	int i, c;

	for (i = 0; i < 3; i++)
		for (c = 0; c < 3; c++)
			to->a[i][c] += from->a[i][c];
}

static void sequential(struct mol *p, struct mol *v, unsigned nodes)
{
	struct mol *f = malloc(NM * sizeof(*f)), *buf = malloc(NM * sizeof(*buf));
	size_t m, s;
	unsigned k;

	if (!f || !buf)
		dsm_die("water: out of memory");
	for (s = 0; s < STEPS; s++) {
		memset(f, 0, NM * sizeof(*f));
		for (m = 0; m < NM; m++)
			intra(p, f, m);
		for (k = 1; k <= nodes; k++) {
			pairs(p, buf, k, nodes);
			for (m = 0; m < NM; m++)
				add(&f[m], &buf[m]);
		}
		for (m = 0; m < NM; m++)
			move(p, v, f, m);
	}
	free(f);
	free(buf);
}

static int close_to(double a, double b)
{
	return fabs(a - b) <= 1e-12 + 1e-9 * fmax(fabs(a), fabs(b));
}

static int same(const struct mol *x, const struct mol *y)
{
	int i, c;

	for (i = 0; i < 3; i++)
		for (c = 0; c < 3; c++)
			if (!close_to(x->a[i][c], y->a[i][c]))
				return 0;
	return 1;
}

static struct mol *pos, *vel, *force;

static void water_worker(void *unused)
{
	struct mol *buf = malloc(NM * sizeof(*buf));
	unsigned me = dsm_worker() + 1, n = dsm_workers(), b, bl;
	unsigned blocks = NM < DSM_LOCKS ? (unsigned)NM : DSM_LOCKS;
	size_t per = (NM + blocks - 1) / blocks, lo, hi, m, s;

	if (!buf)
		dsm_die("water: out of memory");
	dsm_range(NM, &lo, &hi);
	for (s = 0; s < STEPS; s++) {
		/* Owners start their molecules' forces with the bonds. */
		for (m = lo; m < hi; m++) {
			memset(&force[m], 0, sizeof(force[m]));
			intra(pos, force, m);
		}
		dsm_barrier();
		pairs(pos, buf, me, n);
		for (b = 0; b < blocks; b++) {
			bl = (b + (me - 1) * blocks / n) % blocks;
			dsm_lock(bl);
			for (m = bl * per; m < NM && m < (bl + 1) * per; m++)
				add(&force[m], &buf[m]);
			dsm_unlock(bl);
		}
		dsm_barrier();
		for (m = lo; m < hi; m++)
			move(pos, vel, force, m);
		dsm_barrier();
	}
	free(buf);
}

int main(int argc, char **argv)
{
	struct mol *rp, *rv;
	size_t lo, hi, m;
	int ok = -1;
	double t0, ts = 0;

	NM = dsm_arg(argc, argv, 1, NM);
	STEPS = dsm_arg(argc, argv, 2, STEPS);
	if (NM < 2)
		dsm_die("water: at least 2 molecules");
	dsm_init();
	pos = dsm_alloc(NM * sizeof(*pos));
	vel = dsm_alloc(NM * sizeof(*vel));
	force = dsm_alloc(NM * sizeof(*force));
	dsm_range(NM, &lo, &hi);
	for (m = lo; m < hi; m++)
		init(pos, vel, m);
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(water_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		rp = malloc(NM * sizeof(*rp));
		rv = malloc(NM * sizeof(*rv));
		if (!rp || !rv)
			dsm_die("water: out of memory");
		for (m = 0; m < NM; m++)
			init(rp, rv, m);
		ts = dsm_now();
		sequential(rp, rv, dsm_workers());
		ts = dsm_now() - ts;
		ok = 1;
		for (m = 0; m < NM && ok; m++)
			ok = same(&pos[m], &rp[m]) && same(&vel[m], &rv[m]);
		if (!ok)
			fprintf(stderr, "water: molecule %zu off\n", m - 1);
	}
	dsm_report("water", ok, t0, ts, NULL);
	return ok == 0;
}
