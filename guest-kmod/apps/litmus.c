// SPDX-License-Identifier: GPL-2.0
/*
 * litmus: sequential-consistency litmus tests on the DSM, every node
 * running the same program. Each prints one line per test:
 * "LITMUS test=NAME node=N rounds=R violations=V" (V must be 0).
 *   mp       message passing: node 1 writes data = r, then flag = r, for
 *            r = 1..ROUNDS; node 2 reads flag, then data, until the
 *            flag reaches ROUNDS: data older than the flag is forbidden.
 *            The writer pauses halfway until the reader has seen a flag,
 *            so the reader reads at least twice while the writer runs.
 *   sb       store buffering (Dekker): node 1 does x=1; r1=y, node 2
 *            y=1; r2=x; r1 == r2 == 0 is forbidden under SC.
 *   counter  every node adds 1 to a shared counter ROUNDS times under a
 *            DSM lock; the total must be nodes * ROUNDS.
 *   barrier  in phase p every node writes p into its slot; after the
 *            barrier every node must read p in every slot.
 *
 * Usage: litmus [ROUNDS [TEST...]]   (default: all four, in this order)
 */
#include <stdio.h>
#include <string.h>
#include "../libdsm/libdsm.h"

static unsigned long rounds = 50;

static void line(const char *test, unsigned long v)
{
	printf("LITMUS test=%s node=%u rounds=%lu violations=%lu\n", test,
	       dsm_self(), rounds, v);
	fflush(stdout);
}

/* x, y, data, flag on pages of their own: every access is a page-level event. */
static volatile long *page_var(void)
{
	return dsm_alloc(1);
}

/*
 * Halfway through, the writer waits until the reader has seen a non-zero
 * flag: otherwise a writer that runs first (all guests share the host's
 * cores) may finish every round before the reader's first read, and the
 * test would check nothing.
 */
static void mp(void)
{
	volatile long *data = page_var(), *flag = page_var();
	volatile long *seen_flag = page_var();
	unsigned long r, v = 0, seen = 0;
	long f, d;

	dsm_barrier();
	if (dsm_self() == 1) {
		for (r = 1; r <= rounds; r++) {
			if (r > 1 && r == rounds / 2 + 1)
				while (!*seen_flag)
					;
			*data = r;
			*flag = r;
		}
	} else if (dsm_self() == 2) {
		do {
			f = *flag;
			d = *data;
			v += d < f;
			seen++;
			if (f && !*seen_flag)
				*seen_flag = 1;
		} while (f < (long)rounds);
	}
	dsm_barrier();
	line("mp", v);
	if (dsm_self() == 2)
		printf("LITMUS-MP reads=%lu\n", seen);
}

static void sb(void)
{
	volatile long *x = page_var(), *y = page_var(), *res = page_var();
	unsigned long r, v = 0, both = 0;

	for (r = 0; r < rounds; r++) {
		dsm_barrier();
		if (dsm_self() == 1) {
			*x = 1;
			res[0] = *y;
		} else if (dsm_self() == 2) {
			*y = 1;
			res[1] = *x;
		}
		dsm_barrier();
		if (dsm_self() == 1) {
			v += !res[0] && !res[1];
			both += res[0] && res[1];
			*x = 0;
			*y = 0;
		}
	}
	dsm_barrier();
	line("sb", v);
	if (dsm_self() == 1)
		printf("LITMUS-SB both_one=%lu of %lu\n", both, rounds);
}

static void counter(void)
{
	volatile long *c = page_var();
	unsigned long r;

	dsm_barrier();
	for (r = 0; r < rounds; r++) {
		dsm_lock(2);
		*c = *c + 1;
		dsm_unlock(2);
	}
	dsm_barrier();
	line("counter", *c != (long)(rounds * dsm_nodes()));
}

static void phases(void)
{
	volatile long *slot = dsm_alloc(dsm_nodes() * sizeof(long));
	unsigned long p, v = 0, n;

	for (p = 1; p <= rounds; p++) {
		slot[dsm_self() - 1] = p;
		dsm_barrier();
		for (n = 0; n < dsm_nodes(); n++)
			v += slot[n] != (long)p;
		dsm_barrier();
	}
	line("barrier", v);
}

static const struct {
	const char *name;
	void (*run)(void);
} tests[] = {
	{ "mp", mp }, { "sb", sb }, { "counter", counter }, { "barrier", phases },
};

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
	for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		for (a = 2; a < argc && strcmp(argv[a], tests[i].name); a++)
			;
		if (argc <= 2 || a < argc)
			tests[i].run();
	}
	return 0;
}
