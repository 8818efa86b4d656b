// SPDX-License-Identifier: GPL-2.0
/*
 * dsm-prot: checks the DSM page-protection primitive (/dev/dsm,
 * DSM_IOC_PROTECT) and times it against mprotect, as the paper's section
 * 5.1 does: changing a group of scattered pages (every other page) costs
 * one ioctl with the primitive, one mprotect call per page without it.
 *
 * Usage: dsm-prot check | dsm-prot bench ITERS
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "../dsm/uapi.h"

#define PAGES	64

static long psz;
static sigjmp_buf jump;
static volatile sig_atomic_t faults;

static void on_fault(int sig)
{
	(void)sig;
	faults++;
	siglongjmp(jump, 1);
}

static int protect(int fd, const uint32_t *pages, uint32_t n, int prot, int atomic)
{
	struct dsm_protect_req r = {
		.pages = (uintptr_t)pages, .n = n, .prot = prot, .atomic = atomic,
	};

	return ioctl(fd, DSM_IOC_PROTECT, &r);
}

/* 1 if reading (write = 0) or writing the byte faults. */
static int faults_on(volatile uint8_t *p, int write)
{
	int before = faults;

	if (!sigsetjmp(jump, 1)) {
		if (write)
			*p = *p;
		else
			(void)*p;
	}
	return faults != before;
}

static int check(int fd, uint8_t *m)
{
	uint32_t grp[3] = { 0, 2, 4 };
	int i, bad = 0;

	for (i = 0; i < PAGES; i++)
		memset(m + i * psz, i + 1, psz);
	bad |= protect(fd, grp, 3, DSM_PROT_NONE, 0) != 0;
	bad |= !faults_on(m, 0) || !faults_on(m + 4 * psz, 0) || faults_on(m + psz, 1);
	bad |= protect(fd, grp, 3, DSM_PROT_READ, 0) != 0;
	bad |= faults_on(m, 0) || m[2 * psz] != 3 || !faults_on(m + 2 * psz, 1);
	bad |= protect(fd, grp, 3, DSM_PROT_RW, 0) != 0;
	bad |= faults_on(m + 4 * psz, 1) || m[4 * psz + 7] != 5;
	/* With interrupts off, as the completion handler would call it. */
	bad |= protect(fd, grp, 3, DSM_PROT_NONE, 1) != 0 || !faults_on(m, 0);
	bad |= protect(fd, grp, 3, DSM_PROT_RW, 1) != 0 || faults_on(m, 1);
	for (i = 0; i < PAGES; i++)
		bad |= m[i * psz + psz - 1] != (uint8_t)(i + 1);
	printf("prot-check %s faults=%d\n", bad ? "FAILED" : "ok", (int)faults);
	return bad;
}

static uint64_t now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static void bench(int fd, uint8_t *m, int iters)
{
	static const uint32_t sizes[] = { 1, 16, 32 };
	uint8_t *a = mmap(NULL, PAGES * psz, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint32_t grp[32];
	unsigned int s, k;
	int i;

	memset(a, 1, PAGES * psz);
	memset(m, 1, PAGES * psz);
	for (s = 0; s < 3; s++) {
		uint32_t n = sizes[s];
		uint64_t t0, dsm, mp;

		for (k = 0; k < n; k++)
			grp[k] = 2 * k;
		t0 = now();
		for (i = 0; i < iters; i++) {
			protect(fd, grp, n, DSM_PROT_NONE, 0);
			protect(fd, grp, n, DSM_PROT_RW, 0);
		}
		dsm = (now() - t0) / (2 * iters);
		t0 = now();
		for (i = 0; i < iters; i++) {
			for (k = 0; k < n; k++)
				mprotect(a + grp[k] * psz, psz, PROT_NONE);
			for (k = 0; k < n; k++)
				mprotect(a + grp[k] * psz, psz, PROT_READ | PROT_WRITE);
		}
		mp = (now() - t0) / (2 * iters);
		printf("prot-bench pages=%u dsm_ns=%llu mprotect_ns=%llu mprotect/dsm=%.1f\n",
		       n, (unsigned long long)dsm, (unsigned long long)mp,
		       (double)mp / (double)(dsm ? dsm : 1));
	}
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_fault };
	uint8_t *m;
	int fd;

	psz = sysconf(_SC_PAGESIZE);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	fd = open("/dev/dsm", O_RDWR);
	if (fd < 0) {
		perror("dsm-prot: /dev/dsm");
		return 1;
	}
	m = mmap(NULL, PAGES * psz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		perror("dsm-prot: mmap");
		return 1;
	}
	if (argc == 2 && !strcmp(argv[1], "check"))
		return check(fd, m);
	if (argc == 3 && !strcmp(argv[1], "bench")) {
		bench(fd, m, atoi(argv[2]));
		return 0;
	}
	fprintf(stderr, "usage: dsm-prot check | dsm-prot bench ITERS\n");
	return 2;
}
