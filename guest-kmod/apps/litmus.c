// SPDX-License-Identifier: GPL-2.0
/*
 * litmus: sequential-consistency litmus tests on the DSM, every node
 * running the same program with DSM_THREADS workers. Each worker prints one
 * line per test: "LITMUS test=NAME node=N worker=W rounds=R violations=V"
 * (V must be 0). Workers are numbered 0..W-1 across the cluster.
 *   mp       message passing: worker 0 writes data = r, then flag = r, for
 *            r = 1..ROUNDS; every other worker (on node 1's other threads
 *            and on the other nodes, several per node faulting on the same
 *            pages at once when DSM_THREADS > 1) reads flag, then data,
 *            until the flag reaches ROUNDS: data older than the flag is
 *            forbidden. The writer pauses halfway until a reader has seen a
 *            flag, so readers read at least twice while the writer runs.
 *   sb       store buffering (Dekker): worker 0 does x=1; r1=y, the last
 *            worker (another node) y=1; r2=x; r1 == r2 == 0 is forbidden.
 *   counter  every worker adds 1 to a shared counter ROUNDS times under a
 *            DSM lock; the total must be workers * ROUNDS.
 *   barrier  in phase p every worker writes p into its slot; after the
 *            barrier every worker must read p in every slot.
 *
 * Usage: litmus [ROUNDS [TEST...]]   (default: all four, in this order)
 */
#include <stdio.h>
#include <string.h>
#include "../libdsm/libdsm.h"

static unsigned long rounds = 50;

static void line(const char *test, unsigned long v)
{
	printf("LITMUS test=%s node=%u worker=%u rounds=%lu violations=%lu\n",
	       test, dsm_self(), dsm_worker(), rounds, v);
	fflush(stdout);
}

/*
 * Every variable on a page of its own (every access is a page-level
 * event), allocated before the workers start.
 */
static struct {
	volatile long *data, *flag, *seen_flag;
	volatile long *x, *y, *res;
	volatile long *count;
	volatile long *slot;
} v;

static volatile long *page_var(void)
{
	return dsm_alloc(1);
}

/*
 * Halfway through, the writer waits until a reader has seen a non-zero
 * flag: otherwise a writer that runs first (all guests share the host's
 * cores) may finish every round before the readers' first read, and the
 * test would check nothing.
 */
static void mp(void)
{
	unsigned long r, bad = 0, seen = 0;
	long f, d;

	dsm_barrier();
	if (dsm_worker() == 0) {
		for (r = 1; r <= rounds; r++) {
			if (r > 1 && r == rounds / 2 + 1)
				while (!*v.seen_flag)
					;
			*v.data = r;
			*v.flag = r;
		}
	} else {
		do {
			f = *v.flag;
			d = *v.data;
			bad += d < f;
			seen++;
			if (f && !*v.seen_flag)
				*v.seen_flag = 1;
		} while (f < (long)rounds);
	}
	dsm_barrier();
	line("mp", bad);
	if (dsm_worker() != 0)
		printf("LITMUS-MP node=%u worker=%u reads=%lu\n", dsm_self(),
		       dsm_worker(), seen);
}

static void sb(void)
{
	unsigned long r, bad = 0, both = 0, last = dsm_workers() - 1;

	for (r = 0; r < rounds; r++) {
		dsm_barrier();
		if (dsm_worker() == 0) {
			*v.x = 1;
			v.res[0] = *v.y;
		} else if (dsm_worker() == last) {
			*v.y = 1;
			v.res[1] = *v.x;
		}
		dsm_barrier();
		if (dsm_worker() == 0) {
			bad += !v.res[0] && !v.res[1];
			both += v.res[0] && v.res[1];
			*v.x = 0;
			*v.y = 0;
		}
	}
	dsm_barrier();
	line("sb", bad);
	if (dsm_worker() == 0)
		printf("LITMUS-SB both_one=%lu of %lu\n", both, rounds);
}

static void counter(void)
{
	unsigned long r;

	dsm_barrier();
	for (r = 0; r < rounds; r++) {
		dsm_lock(2);
		*v.count = *v.count + 1;
		dsm_unlock(2);
	}
	dsm_barrier();
	line("counter", *v.count != (long)(rounds * dsm_workers()));
}

static void phases(void)
{
	unsigned long p, bad = 0, n;

	for (p = 1; p <= rounds; p++) {
		v.slot[dsm_worker()] = p;
		dsm_barrier();
		for (n = 0; n < dsm_workers(); n++)
			bad += v.slot[n] != (long)p;
		dsm_barrier();
	}
	line("barrier", bad);
}

static const struct {
	const char *name;
	void (*run)(void);
} tests[] = {
	{ "mp", mp }, { "sb", sb }, { "counter", counter }, { "barrier", phases },
};

static int argc_;
static char **argv_;

static void litmus_worker(void *unused)
{
	size_t i;
	int a;

	for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		for (a = 2; a < argc_ && strcmp(argv_[a], tests[i].name); a++)
			;
		if (argc_ <= 2 || a < argc_)
			tests[i].run();
	}
}

int main(int argc, char **argv)
{
	size_t i;
	int a;

	rounds = dsm_arg(argc, argv, 1, rounds);
	for (a = 2; a < argc; a++) {
		for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
			if (!strcmp(argv[a], tests[i].name))
				break;
		if (i == sizeof(tests) / sizeof(tests[0]))
			dsm_die("unknown test %s (mp, sb, counter, barrier)", argv[a]);
	}
	dsm_init();
	if (dsm_workers() < 2)
		dsm_die("litmus needs two workers or more");
	v.data = page_var();
	v.flag = page_var();
	v.seen_flag = page_var();
	v.x = page_var();
	v.y = page_var();
	v.res = page_var();
	v.count = page_var();
	v.slot = dsm_alloc(dsm_workers() * sizeof(long));
	argc_ = argc;
	argv_ = argv;
	dsm_parallel(litmus_worker, NULL);
	return 0;
}
