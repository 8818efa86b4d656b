// SPDX-License-Identifier: GPL-2.0
/*
 * is: integer sort (ranking), after the NAS IS kernel. Each node
 * generates its share of the keys, counts them, adds its counts to the
 * shared histogram under a DSM lock, and after a barrier ranks its keys
 * (a stable counting sort: keys of lower nodes first). Node 1 runs the
 * same ITERS rankings sequentially in private memory (timed: the speedup's
 * reference) and checks the keys, the histogram and every rank against
 * its last one. With DSM_THREADS workers per node, each worker does what a
 * node did.
 *
 * Usage: is [KEYS [MAXKEY [ITERS]]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../libdsm/libdsm.h"

static size_t NK = 1 << 16, B = 1 << 10, ITERS = 3;

static uint32_t key_of(size_t i, size_t it)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL + it * 0xbf58476d1ce4e5b9ULL;

	x ^= x >> 31;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 29;
	/* A skewed distribution, as NAS IS has: the sum of two draws. */
	return ((x & 0xffffffff) % B + (x >> 32) % B) / 2;
}

/*
 * The whole sort, ITERS times, in private memory on one CPU; *secs is its
 * time. Returns whether the DSM run's keys, histogram and ranks match the
 * last iteration's.
 */
static int verify(const uint32_t *keys, const uint32_t *total, const uint32_t *rank,
		  double *secs)
{
	uint32_t *skeys = malloc(NK * sizeof(*skeys)), *srank = malloc(NK * sizeof(*srank));
	uint32_t *scnt = calloc(B, sizeof(*scnt)), *pos = calloc(B, sizeof(*pos));
	size_t i, k, it;
	double t;
	int ok = 1;

	if (!skeys || !srank || !scnt || !pos)
		dsm_die("out of memory");
	t = dsm_now();
	for (it = 0; it < ITERS; it++) {
		memset(scnt, 0, B * sizeof(*scnt));
		for (i = 0; i < NK; i++) {
			skeys[i] = key_of(i, it);
			scnt[skeys[i]]++;
		}
		for (k = 0; k < B; k++)
			pos[k] = k ? pos[k - 1] + scnt[k - 1] : 0;
		for (i = 0; i < NK; i++)
			srank[i] = pos[skeys[i]]++;
	}
	*secs = dsm_now() - t;
	for (k = 0; k < B && ok; k++)
		ok = scnt[k] == total[k];
	if (!ok)
		fprintf(stderr, "is: histogram mismatch (key value %zu)\n", k - 1);
	for (i = 0; i < NK && ok; i++)
		ok = keys[i] == skeys[i] && rank[i] == srank[i];
	if (!ok && i)
		fprintf(stderr, "is: mismatch (key %zu)\n", i - 1);
	free(skeys);
	free(srank);
	free(scnt);
	free(pos);
	return ok;
}

static uint32_t *keys, *total, *cnt, *rank;

static void is_worker(void *unused)
{
	uint32_t *mine = calloc(B, sizeof(*mine)), *base = calloc(B, sizeof(*base));
	size_t lo, hi, i, k, n, it, me = dsm_worker();

	if (!mine || !base)
		dsm_die("out of memory");
	dsm_range(NK, &lo, &hi);
	for (it = 0; it < ITERS; it++) {
		if (me == 0)
			memset(total, 0, B * sizeof(*total));
		memset(mine, 0, B * sizeof(*mine));
		for (i = lo; i < hi; i++) {
			keys[i] = key_of(i, it);
			mine[keys[i]]++;
		}
		memcpy(cnt + me * B, mine, B * sizeof(*mine));
		dsm_barrier();	/* total is cleared */
		dsm_lock(0);
		for (k = 0; k < B; k++)
			total[k] += mine[k];
		dsm_unlock(0);
		dsm_barrier();
		for (k = 0, i = 0; k < B; i += total[k++]) {
			base[k] = i;
			for (n = 0; n < me; n++)
				base[k] += cnt[n * B + k];
		}
		for (i = lo; i < hi; i++)
			rank[i] = base[keys[i]]++;
		dsm_barrier();
	}
	free(mine);
	free(base);
}

int main(int argc, char **argv)
{
	int ok = -1;
	double t0, ts = 0;

	NK = dsm_arg(argc, argv, 1, NK);
	B = dsm_arg(argc, argv, 2, B);
	ITERS = dsm_arg(argc, argv, 3, ITERS);
	dsm_init();
	keys = dsm_alloc(NK * sizeof(*keys));
	rank = dsm_alloc(NK * sizeof(*rank));
	total = dsm_alloc(B * sizeof(*total));
	cnt = dsm_alloc(dsm_workers() * B * sizeof(*cnt));
	t0 = dsm_now();
	dsm_parallel(is_worker, NULL);
	t0 = dsm_now() - t0;
	if (dsm_self() == 1)
		ok = verify(keys, total, rank, &ts);
	dsm_report("is", ok, t0, ts, NULL);
	return ok == 0;
}
