// SPDX-License-Identifier: GPL-2.0
/* libdsm: see libdsm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <ucontext.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "libdsm.h"
#include "udsm.h"

#define DSM_MAX_THREADS	16

static struct {
	int fd;
	uint8_t *base;
	size_t size, used;
	struct dsm_info info;
	struct dsm_stats_user st0;
	unsigned threads;
	int user;		/* udsm_mode(): the user-level DSM runs the protocol here */
	pthread_barrier_t local;	/* the node's workers, inside dsm_parallel */
} g = { .fd = -1, .threads = 1 };

static void dsm_ioctl(unsigned long cmd, void *arg, const char *what);
static int dying;	/* dsm_die: no exit barrier */

/* The node-level barrier: the kernel's, or the user-level DSM's. */
static void node_barrier(void)
{
	if (g.user)
		udsm_barrier();
	else
		dsm_ioctl(DSM_IOC_BARRIER, NULL, "barrier");
}

/* ---- the simulated user-level DSM (uapi.h, the kernel's usim.c) ---- */

static int prot_bits(uint32_t prot)
{
	return prot == DSM_PROT_RW ? PROT_READ | PROT_WRITE :
	       prot == DSM_PROT_READ ? PROT_READ : PROT_NONE;
}

static void usim_mprotect(uint32_t page, uint32_t n, uint32_t prot)
{
	size_t ps = g.info.page_size;

	if (mprotect(g.base + (size_t)page * ps, (size_t)n * ps, prot_bits(prot)))
		dsm_die("mprotect of page %u: %s", page, strerror(errno));
}

/* A user-level DSM's fault handler: ask the protocol, then retry the access. */
static void usim_segv(int sig, siginfo_t *si, void *ctx)
{
	uint8_t *a = si->si_addr;
	ucontext_t *uc = ctx;
	struct dsm_fault_req f;

	if (a < g.base || a >= g.base + g.size) {
		signal(SIGSEGV, SIG_DFL);	/* not ours: the access faults again and kills */
		return;
	}
	f.page = (a - g.base) / g.info.page_size;
	f.write = !!(uc->uc_mcontext.gregs[REG_ERR] & 2);
	if (ioctl(g.fd, DSM_IOC_FAULT, &f)) {
		/* Async-signal-safe: no stdio here. */
		char msg[] = "dsm: DSM fault failed: errno 000\n";
		int e = errno;

		msg[sizeof(msg) - 5] = '0' + e / 100 % 10;
		msg[sizeof(msg) - 4] = '0' + e / 10 % 10;
		msg[sizeof(msg) - 3] = '0' + e % 10;
		if (write(2, msg, sizeof(msg) - 1) < 0)
			_exit(1);
		_exit(1);
	}
}

/*
 * The service thread: every SIGIO means queued messages; SERVE handles
 * them and returns the protection changes to make, which it makes before
 * the next SERVE (the kernel holds messages back until then).
 */
static void *usim_service(void *unused)
{
	static struct dsm_prot_op ops[1024];
	struct dsm_serve s = { .ops = (uintptr_t)ops, .max = 1024 };
	struct timespec wait = { 0, 20 * 1000 * 1000 };
	sigset_t io;
	uint32_t k;

	sigemptyset(&io);
	sigaddset(&io, SIGIO);
	for (;;) {
		/* The timeout also retries messages a shortage left queued. */
		sigtimedwait(&io, NULL, &wait);
		do {
			dsm_ioctl(DSM_IOC_SERVE, &s, "serve");
			for (k = 0; k < s.n; k++)
				usim_mprotect(ops[k].page, 1, ops[k].prot);
			if (s.left && !s.handled && !s.n)
				usleep(50);
		} while (s.n || s.left);
	}
	return NULL;
}

/*
 * A user-level DSM serves its peers only while its process lives: no
 * node leaves before every node is done (node 1 still reads every page
 * to verify the result).
 */
static void usim_exit(void)
{
	if (!dying)
		dsm_barrier();
}

static void udsm_atexit(void)
{
	if (!dying)
		udsm_exit();
}

static void usim_start(void)
{
	uint8_t *map = malloc(g.info.pages);
	struct sigaction sa = { .sa_sigaction = usim_segv, .sa_flags = SA_SIGINFO };
	uint64_t to = (uintptr_t)map;
	pthread_t tid;
	sigset_t io;
	uint32_t i, j;
	int err;

	if (!map)
		dsm_die("out of memory");
	dsm_ioctl(DSM_IOC_PROTMAP, &to, "protection map");
	for (i = 0; i < g.info.pages; i = j) {
		for (j = i + 1; j < g.info.pages && map[j] == map[i]; j++)
			;
		if (map[i] != DSM_PROT_RW)
			usim_mprotect(i, j - i, map[i]);
	}
	free(map);
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL))
		dsm_die("sigaction: %s", strerror(errno));
	/* SIGIO goes to the service thread alone: every later thread inherits the mask. */
	sigemptyset(&io);
	sigaddset(&io, SIGIO);
	pthread_sigmask(SIG_BLOCK, &io, NULL);
	if (fcntl(g.fd, F_SETOWN, getpid()) ||
	    fcntl(g.fd, F_SETFL, fcntl(g.fd, F_GETFL) | O_ASYNC))
		dsm_die("O_ASYNC on /dev/dsm: %s", strerror(errno));
	err = pthread_create(&tid, NULL, usim_service, NULL);
	if (err)
		dsm_die("pthread_create: %s", strerror(err));
	atexit(usim_exit);
}

/* This thread's worker index on its node; -1 outside dsm_parallel. */
static __thread int tl_worker = -1;

void dsm_die(const char *fmt, ...)
{
	va_list ap;

	dying = 1;
	va_start(ap, fmt);
	fprintf(stderr, "dsm: node %u: ", g.info.self);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void dsm_ioctl(unsigned long cmd, void *arg, const char *what)
{
	if (ioctl(g.fd, cmd, arg))
		dsm_die("%s: %s", what, strerror(errno));
}

static unsigned threads_from_env(void)
{
	const char *v = getenv("DSM_THREADS");
	char *end;
	unsigned long t;

	if (!v || !*v)
		return 1;
	t = strtoul(v, &end, 10);
	if (*end || t < 1 || t > DSM_MAX_THREADS)
		dsm_die("DSM_THREADS=%s: want 1 to %d", v, DSM_MAX_THREADS);
	return t;
}

void dsm_init(void)
{
	g.threads = threads_from_env();
	g.user = udsm_mode();
	if (g.user) {
		udsm_init(g.user, &g.info, &g.base, &g.size);
		udsm_stats(&g.st0);
		atexit(udsm_atexit);
		dsm_barrier();
		return;
	}
	g.fd = open("/dev/dsm", O_RDWR);
	if (g.fd < 0)
		dsm_die("/dev/dsm: %s (is dsm.ko loaded?)", strerror(errno));
	if (ioctl(g.fd, DSM_IOC_INFO, &g.info))
		dsm_die("no DSM session (dsmctl open/connect first): %s",
			strerror(errno));
	g.size = (size_t)g.info.pages * g.info.page_size;
	g.base = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0);
	if (g.base == MAP_FAILED)
		dsm_die("mmap of %zu bytes: %s", g.size, strerror(errno));
	if (g.info.user_sim)
		usim_start();
	dsm_ioctl(DSM_IOC_STATS, &g.st0, "stats");
	dsm_barrier();
}

void *dsm_alloc(size_t bytes)
{
	size_t ps = g.info.page_size;
	void *p;

	bytes = (bytes + ps - 1) / ps * ps;
	if (bytes > g.size - g.used)
		dsm_die("shared space exhausted: %zu bytes wanted, %zu left",
			bytes, g.size - g.used);
	p = g.base + g.used;
	g.used += bytes;
	return p;
}

unsigned dsm_self(void)
{
	return g.info.self;
}

unsigned dsm_nodes(void)
{
	return g.info.nodes;
}

unsigned dsm_threads(void)
{
	return g.threads;
}

unsigned dsm_worker(void)
{
	return (g.info.self - 1) * g.threads + (tl_worker > 0 ? tl_worker : 0);
}

unsigned dsm_workers(void)
{
	return g.info.nodes * g.threads;
}

struct worker {
	pthread_t tid;
	int index;
	void (*fn)(void *);
	void *arg;
};

static void *worker_main(void *p)
{
	struct worker *w = p;

	tl_worker = w->index;
	w->fn(w->arg);
	return NULL;
}

void dsm_parallel(void (*fn)(void *), void *arg)
{
	struct worker w[DSM_MAX_THREADS];
	unsigned t;
	int err;

	if (tl_worker >= 0)
		dsm_die("dsm_parallel inside dsm_parallel");
	err = pthread_barrier_init(&g.local, NULL, g.threads);
	if (err)
		dsm_die("pthread_barrier_init: %s", strerror(err));
	for (t = 1; t < g.threads; t++) {
		w[t] = (struct worker){ .index = t, .fn = fn, .arg = arg };
		err = pthread_create(&w[t].tid, NULL, worker_main, &w[t]);
		if (err)
			dsm_die("pthread_create: %s", strerror(err));
	}
	tl_worker = 0;
	fn(arg);
	tl_worker = -1;
	for (t = 1; t < g.threads; t++)
		pthread_join(w[t].tid, NULL);
	pthread_barrier_destroy(&g.local);
}

/*
 * Inside dsm_parallel with several workers: the node's workers meet, the
 * one pthreads picks enters the DSM barrier for the node (so node 1 still
 * counts nodes), and the others wait for it. Every worker's writes
 * before the barrier precede the node's entry; none writes after it
 * before the barrier is passed.
 */
void dsm_barrier(void)
{
	int r;

	if (tl_worker < 0 || g.threads == 1) {
		node_barrier();
		return;
	}
	r = pthread_barrier_wait(&g.local);
	if (r == PTHREAD_BARRIER_SERIAL_THREAD)
		node_barrier();
	else if (r)
		dsm_die("pthread_barrier_wait: %s", strerror(r));
	r = pthread_barrier_wait(&g.local);
	if (r && r != PTHREAD_BARRIER_SERIAL_THREAD)
		dsm_die("pthread_barrier_wait: %s", strerror(r));
}

void dsm_lock(unsigned id)
{
	uint32_t v = id;

	if (g.user)
		udsm_lock(id);
	else
		dsm_ioctl(DSM_IOC_LOCK, &v, "lock");
}

void dsm_unlock(unsigned id)
{
	uint32_t v = id;

	if (g.user)
		udsm_unlock(id);
	else
		dsm_ioctl(DSM_IOC_UNLOCK, &v, "unlock");
}

void dsm_stats(struct dsm_stats_user *st)
{
	if (g.user)
		udsm_stats(st);
	else
		dsm_ioctl(DSM_IOC_STATS, st, "stats");
}

double dsm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t dsm_arg(int argc, char **argv, int i, size_t def)
{
	char *end;
	size_t v;

	if (i >= argc)
		return def;
	v = strtoul(argv[i], &end, 0);
	if (!*argv[i] || *end)
		dsm_die("argument %d (%s) is not a number", i, argv[i]);
	return v;
}

void dsm_range(size_t n, size_t *lo, size_t *hi)
{
	size_t k = g.info.self - 1, parts = g.info.nodes;

	if (tl_worker >= 0) {
		k = dsm_worker();
		parts = dsm_workers();
	}
	*lo = n * k / parts;
	*hi = n * (k + 1) / parts;
}

static double per_us(uint64_t ns, uint64_t n)
{
	return n ? ns / 1e3 / n : 0;
}

void dsm_report(const char *app, int verified, double secs, double seq_secs,
		const char *extra)
{
	struct dsm_stats_user s;
	char seq[32] = "";
	uint64_t rf, wf;

	dsm_stats(&s);
	if (seq_secs > 0)
		snprintf(seq, sizeof(seq), " seq_ms=%.1f", seq_secs * 1e3);
	rf = s.read_faults - g.st0.read_faults;
	wf = s.write_faults - g.st0.write_faults;
	printf("DSM-RESULT app=%s node=%u nodes=%u threads=%u verified=%s time_ms=%.1f "
	       "rfaults=%llu wfaults=%llu msgs=%llu msg_bytes=%llu data_bytes=%llu "
	       "rfault_us=%.1f wfault_us=%.1f inv=%llu irq=%llu process=%llu%s%s%s\n",
	       app, g.info.self, g.info.nodes, g.threads,
	       verified > 0 ? "ok" : verified == 0 ? "FAILED" : "-", secs * 1e3,
	       (unsigned long long)rf, (unsigned long long)wf,
	       (unsigned long long)(s.msgs_sent - g.st0.msgs_sent),
	       (unsigned long long)(s.msg_bytes - g.st0.msg_bytes),
	       (unsigned long long)(s.data_bytes - g.st0.data_bytes),
	       per_us(s.read_fault_ns - g.st0.read_fault_ns, rf),
	       per_us(s.write_fault_ns - g.st0.write_fault_ns, wf),
	       (unsigned long long)(s.invalidations - g.st0.invalidations),
	       (unsigned long long)(s.handled_irq - g.st0.handled_irq),
	       (unsigned long long)(s.handled_process - g.st0.handled_process),
	       seq, extra ? " " : "", extra ? extra : "");
	fflush(stdout);
}
