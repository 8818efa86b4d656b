// SPDX-License-Identifier: GPL-2.0
/*
 * vbench-user: the user-process side of vbench's ping-pong (mode "user",
 * column "Process" in the paper's Table 1). The kernel's completion
 * handler wakes this process; it reads the message from /dev/vbench_msg
 * and answers (serve) or times the round trip (ping). The message format
 * is vbench's: header word, pat(i) body, complemented header word last.
 *
 * Usage: vbench-user serve
 *        vbench-user ping SIZE ITERS [verify]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_MSG	4096
#define PONG	0x80000000u

static uint8_t pattern[MAX_MSG];

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static void fill(uint8_t *buf, uint32_t size, uint32_t word0)
{
	memcpy(buf, pattern, size);
	put32(buf, word0);
	put32(buf + size - 4, ~word0);
}

static int check(const uint8_t *buf, uint32_t size, uint32_t word0, int full)
{
	if (size < 8 || get32(buf) != word0 || get32(buf + size - 4) != ~word0)
		return 0;
	return !full || !memcmp(buf + 4, pattern + 4, size - 8);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static int serve(int fd)
{
	uint8_t buf[MAX_MSG];
	unsigned long served = 0, errors = 0;
	ssize_t n;

	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		uint32_t w = get32(buf);

		if (!check(buf, n, w, 1) || (w & PONG))
			errors++;
		put32(buf, w | PONG);
		put32(buf + n - 4, ~(w | PONG));
		if (write(fd, buf, n) != n) {
			perror("vbench-user: write");
			return 1;
		}
		served++;
	}
	printf("vbench-user: served=%lu errors=%lu (%s)\n", served, errors,
	       n == 0 ? "stopped" : strerror(errno));
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int ping(int fd, uint32_t size, uint32_t iters, int full)
{
	uint8_t out[MAX_MSG], in[MAX_MSG];
	uint64_t sum = 0, min = UINT64_MAX, max = 0, t0, ns, median = 0;
	uint64_t *samples = calloc(iters ? iters : 1, sizeof(uint64_t));
	uint32_t i, done = 0, errors = 0, counted = 0;
	uint32_t warm = iters / 10 < 10 ? iters / 10 : 10;
	ssize_t n;

	if (!samples) {
		perror("vbench-user");
		return 1;
	}
	for (i = 0; i < iters; i++) {
		fill(out, size, i);
		t0 = now_ns();
		if (write(fd, out, size) != (ssize_t)size)
			break;
		n = read(fd, in, sizeof(in));
		ns = now_ns() - t0;
		if (n <= 0)
			break;
		if ((uint32_t)n != size || !check(in, n, i | PONG, full))
			errors++;
		done++;
		if (i >= warm) {
			samples[counted++] = ns;
			sum += ns;
			min = ns < min ? ns : min;
			max = ns > max ? ns : max;
		}
	}
	if (counted) {
		qsort(samples, counted, sizeof(uint64_t), cmp_u64);
		median = samples[counted / 2];
	}
	free(samples);
	printf("size=%u iters=%u done=%u errors=%u rtt_avg_ns=%llu rtt_min_ns=%llu rtt_max_ns=%llu rtt_median_ns=%llu\n",
	       size, iters, done, errors,
	       (unsigned long long)(counted ? sum / counted : 0),
	       (unsigned long long)(counted ? min : 0),
	       (unsigned long long)max, (unsigned long long)median);
	return done == iters ? 0 : 1;
}

int main(int argc, char **argv)
{
	int fd, i;

	for (i = 0; i < MAX_MSG; i++)
		pattern[i] = (uint8_t)(i * 131 + 7);
	fd = open("/dev/vbench_msg", O_RDWR);
	if (fd < 0) {
		perror("vbench-user: /dev/vbench_msg");
		return 1;
	}
	if (argc == 2 && !strcmp(argv[1], "serve"))
		return serve(fd);
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "ping")) {
		uint32_t size = strtoul(argv[2], NULL, 0);

		if (size < 8 || size > MAX_MSG) {
			fprintf(stderr, "vbench-user: size must be 8..%d\n", MAX_MSG);
			return 2;
		}
		return ping(fd, size, strtoul(argv[3], NULL, 0),
			    argc == 5 && !strcmp(argv[4], "verify"));
	}
	fprintf(stderr, "usage: vbench-user serve | vbench-user ping SIZE ITERS [verify]\n");
	return 2;
}
