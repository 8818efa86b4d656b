// SPDX-License-Identifier: GPL-2.0
/*
 * dsm-bench: remote fault latency, seen by the application (trap, the
 * protocol's round trips, the page's RDMA, the protection change, the
 * wake-up). Run on every node of a 3-node session. Node 1 becomes the
 * owner of PAGES pages and node 3 reads them (so the owner is read-only,
 * as when a page is widely read: then an RDMA Read may fetch it without
 * the owner's CPU); node 2 read-faults each (timed), then, once node 1
 * has written them all again (invalidating the copies), write-faults each
 * (timed; data and ownership come from node 1).
 *
 * Usage: dsm-bench PAGES
 * Prints (node 2): DSM-FAULTS pages=P read_us=R write_us=W
 */
#include <stdio.h>
#include "../libdsm/libdsm.h"

int main(int argc, char **argv)
{
	unsigned long n = dsm_arg(argc, argv, 1, 64), i, ps = 4096;
	volatile char *m;
	double t, rd = 0, wr = 0;
	long sum = 0;

	dsm_init();
	if (dsm_nodes() < 3)
		dsm_die("dsm-bench needs 3 nodes");
	m = dsm_alloc(n * ps);
	if (dsm_self() == 1)
		for (i = 0; i < n; i++)
			m[i * ps] = (char)i;
	dsm_barrier();
	if (dsm_self() == 3)
		for (i = 0; i < n; i++)
			sum += m[i * ps + 8];
	dsm_barrier();
	if (dsm_self() == 2) {
		t = dsm_now();
		for (i = 0; i < n; i++)
			sum += m[i * ps + 8];
		rd = dsm_now() - t;
	}
	dsm_barrier();
	if (dsm_self() == 1)
		for (i = 0; i < n; i++)
			m[i * ps + 1] = (char)i;
	dsm_barrier();
	if (dsm_self() == 2) {
		t = dsm_now();
		for (i = 0; i < n; i++)
			m[i * ps + 16] = 1;
		wr = dsm_now() - t;
		for (i = 0; i < n; i++)
			sum += m[i * ps] != (char)i || m[i * ps + 1] != (char)i;
		printf("DSM-FAULTS pages=%lu read_us=%.1f write_us=%.1f bad=%ld\n",
		       n, rd * 1e6 / n, wr * 1e6 / n, sum);
	}
	dsm_barrier();
	return 0;
}
