// SPDX-License-Identifier: GPL-2.0
/*
 * tsp: travelling salesman by branch and bound. The jobs are the tours'
 * first three hops; nodes take jobs from a shared counter and publish a
 * shorter tour under a DSM lock, and every node prunes with the shared
 * best length. Node 1 checks the length against a sequential search and
 * the published tour's length against the distance table. With
 * DSM_THREADS workers per node, every worker takes jobs.
 *
 * Usage: tsp [CITIES]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

#define MAXC	16
#define LOCK	1

static int NC = 10;
static int dist[MAXC][MAXC];

struct shared {
	int next_job;
	int best;
	int tour[MAXC];
};

static struct shared *sh;
static int local_best = 1 << 30;

static void cities(void)
{
	int x[MAXC], y[MAXC], i, j;

	for (i = 0; i < NC; i++) {
		x[i] = (i * 7919) % 97;
		y[i] = (i * 104729) % 89;
	}
	for (i = 0; i < NC; i++)
		for (j = 0; j < NC; j++)
			dist[i][j] = abs(x[i] - x[j]) + abs(y[i] - y[j]);
}

static int best(void)
{
	return sh ? sh->best : local_best;
}

static void publish(const int *tour, int len)
{
	if (!sh) {
		if (len < local_best)
			local_best = len;
		return;
	}
	dsm_lock(LOCK);
	if (len < sh->best) {
		sh->best = len;
		memcpy(sh->tour, tour, NC * sizeof(int));
	}
	dsm_unlock(LOCK);
}

static void search(int *tour, int depth, int len, unsigned used)
{
	int c;

	if (len >= best())
		return;
	if (depth == NC) {
		len += dist[tour[NC - 1]][0];
		if (len < best())
			publish(tour, len);
		return;
	}
	for (c = 1; c < NC; c++) {
		if (used & (1u << c))
			continue;
		tour[depth] = c;
		search(tour, depth + 1, len + dist[tour[depth - 1]][c], used | 1u << c);
	}
}

/* Job j: the hops 0 -> a -> b -> c, all distinct; 0 when j names no valid tour. */
static int job(int j, int *tour, int *len, unsigned *used)
{
	int n = NC - 1, a = j / (n * n) + 1, b = j / n % n + 1, c = j % n + 1;

	if (a == b || b == c || a == c)
		return 0;
	tour[0] = 0;
	tour[1] = a;
	tour[2] = b;
	tour[3] = c;
	*len = dist[0][a] + dist[a][b] + dist[b][c];
	*used = 1u | 1u << a | 1u << b | 1u << c;
	return 1;
}

static void run_jobs(int shared)
{
	int njobs = (NC - 1) * (NC - 1) * (NC - 1), tour[MAXC], len, j;
	unsigned used;

	for (j = 0;; j++) {
		if (shared) {
			dsm_lock(LOCK);
			j = sh->next_job++;
			dsm_unlock(LOCK);
		}
		if (j >= njobs)
			return;
		if (job(j, tour, &len, &used))
			search(tour, 4, len, used);
	}
}

static void tsp_worker(void *unused)
{
	run_jobs(1);
	dsm_barrier();
}

int main(int argc, char **argv)
{
	int ok = -1, i, len, seq = -1;
	double ts = 0;
	char extra[32];
	double t0;

	NC = dsm_arg(argc, argv, 1, NC);
	if (NC < 5 || NC > MAXC)
		dsm_die("cities: 5..%d", MAXC);
	cities();
	dsm_init();
	sh = dsm_alloc(sizeof(*sh));
	if (dsm_self() == 1)
		sh->best = 1 << 30;
	dsm_barrier();
	t0 = dsm_now();
	dsm_parallel(tsp_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1) {
		struct shared *s = sh;

		sh = NULL;
		ts = dsm_now();
		run_jobs(0);
		ts = dsm_now() - ts;
		seq = local_best;
		for (i = 0, len = 0; i < NC; i++)
			len += dist[s->tour[i]][s->tour[(i + 1) % NC]];
		ok = s->best == seq && len == seq;
		if (!ok)
			fprintf(stderr, "tsp: best %d, tour %d, sequential %d\n",
				s->best, len, seq);
	}
	snprintf(extra, sizeof(extra), "best=%d", seq);
	dsm_report("tsp", ok, t0, ts, dsm_self() == 1 ? extra : NULL);
	return ok == 0;
}
