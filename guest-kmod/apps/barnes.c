// SPDX-License-Identifier: GPL-2.0
/*
 * barnes: Barnes-Hut n-body steps after SPLASH-2's barnes. Each step the
 * octree is built anew in shared memory: every node inserts its own bodies,
 * descending from the root and taking the DSM lock of each cell whose child
 * slot it reads or changes (a leaf that meets a second body is split into a
 * new cell, allocated from a shared counter under its own lock). Node 1 then
 * computes the cells' centres of mass (post-order; SPLASH-2 does this in
 * parallel, here it is one node's serial phase), and every node computes the
 * forces on its bodies by walking the tree (a cell far enough away, size /
 * distance < THETA, counts as one mass at its centre) and moves them.
 *
 * Verification is bit for bit: an octree of distinct points over a given
 * root box is the same whatever order the points go in, and centres of mass
 * and walks visit children in slot order, so node 1's sequential run (the
 * same code on private memory) must produce the same doubles.
 *
 * With DSM_THREADS workers per node, every worker inserts, walks and moves
 * its share of the bodies; node 1's first worker does the serial phases.
 *
 * Usage: barnes [BODIES [STEPS]]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

struct body {
	double x[3], v[3], a[3], m;
};

/*
 * child[k]: 0 empty, > 0 a cell's index, < 0 the body -(child + 1).
 * Cell 1 is the root.
 */
struct cell {
	double c[3], half, m, com[3];
	int32_t child[8];
};

struct tree {
	uint64_t ncells;	/* cells in use, the root included (index 0 unused) */
	struct cell cell[];
};

static size_t NB = 256, STEPS = 2, MAXCELLS;
static int shared;		/* take DSM locks (the DSM run) or not (sequential) */

#define DT	0.01
#define EPS2	0.01
#define THETA	0.5
#define ALLOC_LOCK	0
#define CELL_LOCKS	(DSM_LOCKS - 1)

static void lock(unsigned id)
{
	if (shared)
		dsm_lock(id);
}

static void unlock(unsigned id)
{
	if (shared)
		dsm_unlock(id);
}

static unsigned cell_lock(int32_t c)
{
	return 1 + (unsigned)c % CELL_LOCKS;
}

static void init(struct body *b, size_t i)
{
	/* A deterministic spread (no two bodies in one place). */
	b[i].x[0] = (double)((i * 37) % 101) - 50 + 0.001 * (double)i;
	b[i].x[1] = (double)((i * 53) % 103) - 51;
	b[i].x[2] = (double)((i * 71) % 107) - 53;
	b[i].m = 1.0 + (double)(i % 7);
	memset(b[i].v, 0, sizeof(b[i].v));
	memset(b[i].a, 0, sizeof(b[i].a));
}

static int octant(const struct cell *c, const double *x)
{
	return (x[0] >= c->c[0]) | (x[1] >= c->c[1]) << 1 | (x[2] >= c->c[2]) << 2;
}

static int32_t new_cell(struct tree *t, const struct cell *parent, int oct)
{
	struct cell *c;
	int32_t n;
	int k;

	lock(ALLOC_LOCK);
	n = (int32_t)t->ncells++;
	unlock(ALLOC_LOCK);
	if ((size_t)n >= MAXCELLS)
		dsm_die("barnes: more than %zu cells", MAXCELLS);
	c = &t->cell[n];
	memset(c, 0, sizeof(*c));
	c->half = parent->half / 2;
	for (k = 0; k < 3; k++)
		c->c[k] = parent->c[k] + (oct >> k & 1 ? c->half : -c->half);
	return n;
}

static void insert(struct tree *t, const struct body *b, size_t i)
{
	int32_t cur = 1, ch, nc, other;
	int oct, depth;

	for (depth = 0; depth < 64; depth++) {
		oct = octant(&t->cell[cur], b[i].x);
		lock(cell_lock(cur));
		ch = t->cell[cur].child[oct];
		if (ch == 0) {
			t->cell[cur].child[oct] = -(int32_t)i - 1;
			unlock(cell_lock(cur));
			return;
		}
		if (ch < 0) {
			/* A body here: a new cell takes it, and we go on into it. */
			nc = new_cell(t, &t->cell[cur], oct);
			other = -ch - 1;
			t->cell[nc].child[octant(&t->cell[nc], b[other].x)] = ch;
			t->cell[cur].child[oct] = nc;
			ch = nc;
		}
		unlock(cell_lock(cur));
		cur = ch;
	}
	dsm_die("barnes: tree deeper than 64 (bodies in one place?)");
}

/* Mass and centre of mass of cell c, children in slot order. */
static void mass(struct tree *t, const struct body *b, int32_t c)
{
	struct cell *p = &t->cell[c];
	double m, x[3];
	int k, d;

	p->m = 0;
	memset(p->com, 0, sizeof(p->com));
	for (k = 0; k < 8; k++) {
		int32_t ch = p->child[k];

		if (ch == 0)
			continue;
		if (ch > 0) {
			mass(t, b, ch);
			m = t->cell[ch].m;
			memcpy(x, t->cell[ch].com, sizeof(x));
		} else {
			m = b[-ch - 1].m;
			memcpy(x, b[-ch - 1].x, sizeof(x));
		}
		p->m += m;
		for (d = 0; d < 3; d++)
			p->com[d] += m * x[d];
	}
	for (d = 0; d < 3; d++)
		p->com[d] /= p->m;
}

static void pull(double *a, const double *from, const double *to, double m)
{
	double d[3], r2 = EPS2, f;
	int k;

	for (k = 0; k < 3; k++) {
		d[k] = to[k] - from[k];
		r2 += d[k] * d[k];
	}
	f = m / (r2 * sqrt(r2));
	for (k = 0; k < 3; k++)
		a[k] += f * d[k];
}

/* The acceleration of body i from cell c. */
static void walk(const struct tree *t, const struct body *b, size_t i, int32_t c, double *a)
{
	const struct cell *p = &t->cell[c];
	double d2 = 0;
	int k;

	for (k = 0; k < 3; k++)
		d2 += (p->com[k] - b[i].x[k]) * (p->com[k] - b[i].x[k]);
	if (4 * p->half * p->half < THETA * THETA * d2) {
		pull(a, b[i].x, p->com, p->m);
		return;
	}
	for (k = 0; k < 8; k++) {
		int32_t ch = p->child[k];

		if (ch > 0)
			walk(t, b, i, ch, a);
		else if (ch < 0 && (size_t)(-ch - 1) != i)
			pull(a, b[i].x, b[-ch - 1].x, b[-ch - 1].m);
	}
}

/* The root box around every body. */
static void root(struct tree *t, const struct body *b)
{
	double lo[3], hi[3], h = 0;
	size_t i;
	int k;

	for (k = 0; k < 3; k++)
		lo[k] = hi[k] = b[0].x[k];
	for (i = 1; i < NB; i++)
		for (k = 0; k < 3; k++) {
			lo[k] = fmin(lo[k], b[i].x[k]);
			hi[k] = fmax(hi[k], b[i].x[k]);
		}
	t->ncells = 2;
	memset(&t->cell[1], 0, sizeof(t->cell[1]));
	for (k = 0; k < 3; k++) {
		t->cell[1].c[k] = (lo[k] + hi[k]) / 2;
		h = fmax(h, (hi[k] - lo[k]) / 2);
	}
	t->cell[1].half = h * 1.001 + 1e-9;
}

static void step_body(const struct tree *t, struct body *b, size_t i)
{
	memset(b[i].a, 0, sizeof(b[i].a));
	walk(t, b, i, 1, b[i].a);
}

static void move(struct body *b, size_t i)
{
	int k;

	for (k = 0; k < 3; k++) {
		b[i].v[k] += b[i].a[k] * DT;
		b[i].x[k] += b[i].v[k] * DT;
	}
}

static struct body *b;
static struct tree *t;

static void barnes_worker(void *unused)
{
	size_t lo, hi, i, s;

	dsm_range(NB, &lo, &hi);
	for (s = 0; s < STEPS; s++) {
		if (dsm_worker() == 0)
			root(t, b);
		dsm_barrier();
		for (i = lo; i < hi; i++)
			insert(t, b, i);
		dsm_barrier();
		if (dsm_worker() == 0)
			mass(t, b, 1);
		dsm_barrier();
		for (i = lo; i < hi; i++)
			step_body(t, b, i);
		dsm_barrier();
		for (i = lo; i < hi; i++)
			move(b, i);
		dsm_barrier();
	}
}

int main(int argc, char **argv)
{
	struct body *rb;
	struct tree *rt;
	size_t lo, hi, i, s, tree_bytes;
	int ok = -1;
	double t0, ts = 0;

	NB = dsm_arg(argc, argv, 1, NB);
	STEPS = dsm_arg(argc, argv, 2, STEPS);
	if (NB < 2)
		dsm_die("barnes: at least 2 bodies");
	MAXCELLS = 8 * NB + 64;
	tree_bytes = sizeof(struct tree) + MAXCELLS * sizeof(struct cell);
	dsm_init();
	b = dsm_alloc(NB * sizeof(*b));
	t = dsm_alloc(tree_bytes);
	dsm_range(NB, &lo, &hi);
	for (i = lo; i < hi; i++)
		init(b, i);
	dsm_barrier();
	shared = 1;
	t0 = dsm_now();
	dsm_parallel(barnes_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		shared = 0;
		rb = malloc(NB * sizeof(*rb));
		rt = malloc(tree_bytes);
		if (!rb || !rt)
			dsm_die("barnes: out of memory");
		for (i = 0; i < NB; i++)
			init(rb, i);
		ts = dsm_now();
		for (s = 0; s < STEPS; s++) {
			root(rt, rb);
			for (i = 0; i < NB; i++)
				insert(rt, rb, i);
			mass(rt, rb, 1);
			for (i = 0; i < NB; i++)
				step_body(rt, rb, i);
			for (i = 0; i < NB; i++)
				move(rb, i);
		}
		ts = dsm_now() - ts;
		ok = 1;
		for (i = 0; i < NB && ok; i++)
			ok = !memcmp(b[i].x, rb[i].x, sizeof(b[i].x)) &&
			     !memcmp(b[i].v, rb[i].v, sizeof(b[i].v));
		if (!ok)
			fprintf(stderr, "barnes: mismatch at body %zu\n", i - 1);
	}
	dsm_report("barnes", ok, t0, ts, NULL);
	return ok == 0;
}
