/* SPDX-License-Identifier: GPL-2.0 */
/*
 * libdsm: the DSM's small user library. One process per node:
 * dsm_init() maps the whole shared space (every node sees the same bytes
 * at the same offsets) and waits for every node; dsm_alloc() hands out
 * page-aligned pieces of it in call order, so nodes that allocate in the
 * same order get the same objects. Errors print and exit.
 *
 * Threads: a process runs DSM_THREADS (environment, default 1) workers
 * per node inside dsm_parallel(). Workers are numbered node-major
 * (worker w of node n is (n - 1) * threads + w), so a worker's share of
 * an array lies inside its node's share. Inside dsm_parallel, the barrier
 * is hierarchical (the node's threads meet, one of them enters the DSM
 * barrier, all leave together) and dsm_range() is per worker; outside
 * it, both are per node. Locks are per lock id across all threads: the
 * kernel queues a node's threads locally and lets one compete.
 *
 * Protocol: the kernel DSM (/dev/dsm, a session the harness opened) by
 * default; DSM_MODE=user or user-poll runs it in this process instead,
 * over libibverbs (udsm.c: DSM_NODE, DSM_NODES, DSM_DEV, DSM_DIR, DSM_PAGES,
 * DSM_TIMEOUT), with the same API and result line.
 */
#ifndef LIBDSM_H
#define LIBDSM_H

#include <stddef.h>
#include <stdint.h>
#include "../dsm/uapi.h"

void dsm_init(void);
void *dsm_alloc(size_t bytes);
unsigned dsm_self(void);		/* 1..dsm_nodes() */
unsigned dsm_nodes(void);
unsigned dsm_threads(void);		/* workers per node */
/* 0..dsm_workers()-1: this worker (outside dsm_parallel: the node's first). */
unsigned dsm_worker(void);
unsigned dsm_workers(void);		/* nodes x threads */
/* Runs fn(arg) in every worker of this node (the caller is worker 0); returns when all have. */
void dsm_parallel(void (*fn)(void *), void *arg);
void dsm_barrier(void);
void dsm_lock(unsigned id);		/* id < DSM_LOCKS */
void dsm_unlock(unsigned id);
void dsm_stats(struct dsm_stats_user *st);
double dsm_now(void);			/* seconds, monotonic */
/* Numeric argument i of the program, or def when absent; dies on a non-number. */
size_t dsm_arg(int argc, char **argv, int i, size_t def);
/* [*lo, *hi): this worker's (outside dsm_parallel: node's) share of n items, in order. */
void dsm_range(size_t n, size_t *lo, size_t *hi);
/*
 * Prints this node's result line: app, verified (1 ok, 0 failed, -1 not
 * checked here), seconds, the sequential run's seconds (0: none here),
 * and the protocol counters since dsm_init().
 */
void dsm_report(const char *app, int verified, double secs, double seq_secs,
		const char *extra);
void dsm_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif /* LIBDSM_H */
