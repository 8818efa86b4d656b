// SPDX-License-Identifier: GPL-2.0
/*
 * rds-echo: Reliable Datagram Sockets between two guests, over the kernel's
 * own RDS (rds, rds_rdma: RC connections set up through rdma_cm). Debian 12
 * has no rds-tools, so this plays rds-ping's part and checks every byte.
 *
 *   rds-echo serve ADDR PORT
 *	bind ADDR:PORT (an IPoIB address) and send every message back to its
 *	sender, until killed
 *   rds-echo ping LOCAL ADDR PORT COUNT WINDOW SIZE...
 *	from LOCAL, send COUNT messages of each SIZE to ADDR:PORT, WINDOW in
 *	flight at a time; every echo must come back whole, with the bytes sent
 *
 * The socket is held to the InfiniBand transport (SO_RDS_TRANSPORT), so a
 * run never passes over loopback or TCP in its place. Exit 0 only when every
 * echo was checked; otherwise the first mismatch or error is printed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_RDS
#define AF_RDS		21
#endif
#ifndef SOL_RDS
#define SOL_RDS		276
#endif
#define SO_RDS_TRANSPORT	8
#define RDS_TRANS_IB		0

/* RDS's largest message (RDS_MAX_MSG_SIZE). */
#define MAX_MSG		(1 << 20)
#define MAX_WINDOW	64
#define REPLY_WAIT_MS	20000

static void die(const char *what)
{
	fprintf(stderr, "rds-echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct sockaddr_in inet(const char *addr, int port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };

	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) {
		fprintf(stderr, "rds-echo: not an IPv4 address: %s\n", addr);
		exit(2);
	}
	return sin;
}

/* An RDS socket on the IB transport, bound to addr:port, with buffers for a window of
 * the largest messages (RDS refuses a message over half the send buffer). */
static int rds_socket(const char *addr, int port)
{
	struct sockaddr_in sin = inet(addr, port);
	int fd = socket(AF_RDS, SOCK_SEQPACKET, 0);
	int ib = RDS_TRANS_IB, buf = 2 * MAX_WINDOW * MAX_MSG;

	if (fd < 0)
		die("socket(AF_RDS) (is rds_rdma loaded?)");
	if (setsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &ib, sizeof(ib)))
		die("SO_RDS_TRANSPORT ib");
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf)) ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf)))
		die("socket buffers");
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)))
		die("bind");
	return fd;
}

/* Byte i of message seq of size len: differs between messages and positions. */
static uint8_t pattern(uint32_t seq, uint32_t len, uint32_t i)
{
	uint32_t x = seq * 2654435761u ^ len * 40503u ^ i * 2246822519u;

	return (uint8_t)(x ^ x >> 13 ^ x >> 24);
}

static void fill(uint8_t *p, uint32_t seq, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		p[i] = pattern(seq, len, i);
}

/* The first byte where p is not message seq, or -1. */
static long mismatch(const uint8_t *p, uint32_t seq, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		if (p[i] != pattern(seq, len, i))
			return i;
	return -1;
}

static int serve(const char *addr, int port)
{
	int fd = rds_socket(addr, port);
	uint8_t *buf = malloc(MAX_MSG);
	unsigned long n = 0;

	if (!buf)
		die("malloc");
	printf("rds-echo: serving on %s:%d\n", addr, port);
	fflush(stdout);
	for (;;) {
		struct sockaddr_in from;
		socklen_t flen = sizeof(from);
		ssize_t got = recvfrom(fd, buf, MAX_MSG, 0, (struct sockaddr *)&from, &flen);

		if (got < 0) {
			if (errno == EINTR)
				continue;
			die("recvfrom");
		}
		/* The sender's window bounds what is queued here; retry a full queue. */
		while (sendto(fd, buf, got, 0, (struct sockaddr *)&from, flen) < 0) {
			if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR)
				die("sendto (echo)");
			usleep(1000);
		}
		n++;
	}
	return 0;
}

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Waits for the echo of message seq (echoes come back in order: RDS delivers in order
 * between two sockets) and checks it. */
static void take_echo(int fd, uint8_t *buf, uint32_t seq, uint32_t len)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t got;
	long bad;

	if (poll(&p, 1, REPLY_WAIT_MS) != 1) {
		fprintf(stderr, "rds-echo: no echo of message %u (%u bytes) in %d ms\n",
			seq, len, REPLY_WAIT_MS);
		exit(1);
	}
	got = recv(fd, buf, MAX_MSG, 0);
	if (got < 0)
		die("recv");
	if ((uint32_t)got != len) {
		fprintf(stderr, "rds-echo: message %u came back with %zd bytes, not %u\n",
			seq, got, len);
		exit(1);
	}
	bad = mismatch(buf, seq, len);
	if (bad >= 0) {
		fprintf(stderr, "rds-echo: message %u (%u bytes) differs at byte %ld\n",
			seq, len, bad);
		exit(1);
	}
}

static int ping(const char *local, const char *addr, int port, int count, int window,
		char **sizes, int nsizes)
{
	struct sockaddr_in to = inet(addr, port);
	int fd = rds_socket(local, 0);
	uint8_t *out = malloc(MAX_MSG), *in = malloc(MAX_MSG);
	uint32_t seq = 0;
	unsigned long long bytes = 0;

	if (!out || !in)
		die("malloc");
	if (window < 1 || window > MAX_WINDOW || count < 1) {
		fprintf(stderr, "rds-echo: COUNT >= 1 and WINDOW in 1..%d\n", MAX_WINDOW);
		return 2;
	}
	for (int s = 0; s < nsizes; s++) {
		long len = strtol(sizes[s], NULL, 0);
		double t;

		if (len < 1 || len > MAX_MSG) {
			fprintf(stderr, "rds-echo: SIZE in 1..%d: %s\n", MAX_MSG, sizes[s]);
			return 2;
		}
		t = now_us();
		for (int sent = 0, done = 0; done < count;) {
			/* Keep the window full, then take the oldest echo. */
			while (sent < count && sent - done < window) {
				fill(out, seq + sent, len);
				if (sendto(fd, out, len, 0, (struct sockaddr *)&to, sizeof(to)) < 0) {
					if (errno != ENOBUFS && errno != EAGAIN)
						die("sendto");
					break;	/* queue full: take an echo first */
				}
				sent++;
			}
			if (sent == done) {
				usleep(1000);
				continue;
			}
			take_echo(fd, in, seq + done, len);
			done++;
		}
		t = now_us() - t;
		seq += count;
		bytes += (unsigned long long)count * len;
		printf("rds-echo: %d x %ld bytes verified, window %d, %.1f us per message\n",
		       count, len, window, t / count);
	}
	printf("rds-echo: %u messages, %llu bytes, every echo verified\n", seq, bytes);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "serve"))
		return serve(argv[2], atoi(argv[3]));
	if (argc >= 8 && !strcmp(argv[1], "ping"))
		return ping(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
			    argv + 7, argc - 7);
	fprintf(stderr,
		"usage: rds-echo serve ADDR PORT\n"
		"       rds-echo ping LOCAL ADDR PORT COUNT WINDOW SIZE...\n");
	return 2;
}
