// SPDX-License-Identifier: GPL-2.0
/* libdsm: see libdsm.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "libdsm.h"

static struct {
	int fd;
	uint8_t *base;
	size_t size, used;
	struct dsm_info info;
	struct dsm_stats_user st0;
} g = { .fd = -1 };

void dsm_die(const char *fmt, ...)
{
	va_list ap;

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

void dsm_init(void)
{
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

void dsm_barrier(void)
{
	dsm_ioctl(DSM_IOC_BARRIER, NULL, "barrier");
}

void dsm_lock(unsigned id)
{
	uint32_t v = id;

	dsm_ioctl(DSM_IOC_LOCK, &v, "lock");
}

void dsm_unlock(unsigned id)
{
	uint32_t v = id;

	dsm_ioctl(DSM_IOC_UNLOCK, &v, "unlock");
}

void dsm_stats(struct dsm_stats_user *st)
{
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
	size_t k = g.info.self - 1, nodes = g.info.nodes;

	*lo = n * k / nodes;
	*hi = n * (k + 1) / nodes;
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
	printf("DSM-RESULT app=%s node=%u nodes=%u verified=%s time_ms=%.1f "
	       "rfaults=%llu wfaults=%llu msgs=%llu msg_bytes=%llu data_bytes=%llu "
	       "rfault_us=%.1f wfault_us=%.1f inv=%llu irq=%llu process=%llu%s%s%s\n",
	       app, g.info.self, g.info.nodes,
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
