// SPDX-License-Identifier: GPL-2.0
/*
 * tipc-echo: TIPC between guests, over the kernel's own tipc module and its
 * InfiniBand media (a bearer on ib0: `tipc-up`), with every byte checked; and
 * a one-byte ping-pong over TIPC and over TCP on ib0, for their latencies.
 *
 *   tipc-echo serve INSTANCE
 *	bind service {18888, INSTANCE} to a reliable datagram (RDM) socket and
 *	{18889, INSTANCE} to a TIPC stream listener, both in cluster scope, and
 *	listen on TCP port 18888; echo every message (RDM) or byte (streams)
 *	back, until killed. A datagram of 8 bytes or more is checked here
 *	before it goes back (see fill()); a bad one is answered with a line
 *	that says what was wrong, and logged.
 *   tipc-echo send INSTANCE COUNT SIZE...
 *	wait (20 s at most, through TIPC's topology server) until service
 *	{18888, INSTANCE} is published, then send it COUNT messages of each
 *	SIZE (1 to 66000, TIPC's largest), one at a time; every echo must come
 *	back from the node that published the service, whole, with the bytes
 *	sent. Then a message of 66001 bytes must be refused (EMSGSIZE).
 *   tipc-echo lat rdm|stream INSTANCE ROUNDS
 *   tipc-echo lat tcp ADDR ROUNDS
 *	ROUNDS one-byte round trips (after 20 not counted) to the server over
 *	an RDM socket, a TIPC stream or TCP to ADDR (ib0's address); prints the
 *	round trip's mean and median in microseconds, and half of each (the
 *	one-way latency a ping-pong reports), on a line starting "LAT ".
 *   tipc-echo bw stream INSTANCE SIZE BYTES
 *   tipc-echo bw tcp ADDR SIZE BYTES
 *	BYTES (rounded down to whole SIZE writes) one way to the server's sink,
 *	service {18890, INSTANCE} over a TIPC stream or TCP port 18890 at ADDR,
 *	in writes of SIZE bytes; the sink checks every byte (a pattern of the
 *	stream's offset) and answers with how many came and where the first
 *	wrong one was. Prints the throughput in MB/s (10^6 bytes/s), from the
 *	first write to the answer, on a line starting "BW ".
 *
 * Exit 0 when all went as said; 1 on an error, 2 on a usage error, 3 when
 * data came back wrong (the first difference is printed).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/sockios.h>
#include <linux/tipc.h>

#define ECHO_TYPE	18888	/* the RDM echo service */
#define STREAM_TYPE	18889	/* the TIPC stream echo service */
#define TCP_PORT	18888
#define SINK_TYPE	18890	/* the TIPC stream sink */
#define SINK_PORT	18890	/* the TCP sink */
#define PERIOD		65521	/* the sink's pattern repeats after this many bytes */
#define NLISTEN		5	/* the server's listening sockets */
#define MAX_MSG		TIPC_MAX_USER_MSG_SIZE
#define HDR		8	/* seq and size, where a message has room */
#define WAIT_MS		20000
#define WARMUP		20
#define MAX_CONNS	32

static void die(const char *what)
{
	fprintf(stderr, "tipc-echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: tipc-echo serve INSTANCE\n"
		"       tipc-echo send INSTANCE COUNT SIZE...\n"
		"       tipc-echo lat rdm|stream INSTANCE ROUNDS\n"
		"       tipc-echo lat tcp ADDR ROUNDS\n"
		"       tipc-echo bw stream INSTANCE SIZE BYTES\n"
		"       tipc-echo bw tcp ADDR SIZE BYTES\n");
	exit(2);
}

static unsigned long number(const char *s, unsigned long min, unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || *s == '\0' || *end != '\0' || v < min || v > max) {
		fprintf(stderr, "tipc-echo: %s: not a number from %lu to %lu\n", s, min, max);
		exit(2);
	}
	return v;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v;
	p[1] = v >> 8;
	p[2] = v >> 16;
	p[3] = v >> 24;
}

static uint32_t get32(const uint8_t *p)
{
	return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * Message seq of size len: where it has room, its sequence number and size
 * (little-endian) first, so that the server can check it too; then bytes of
 * a generator seeded by both, so that every message differs from every other.
 */
static void fill(uint8_t *p, uint32_t len, uint32_t seq)
{
	uint32_t x = len * 2654435761u ^ (seq + 1) * 2246822519u;
	uint32_t i = 0;

	if (len >= HDR) {
		put32(p, seq);
		put32(p + 4, len);
		i = HDR;
	}
	for (; i < len; i++) {
		x = x * 1664525u + 1013904223u;
		p[i] = x >> 24;
	}
}

/* The first byte where p (len bytes) differs from message seq, or -1. */
static long mismatch(const uint8_t *p, uint32_t len, uint32_t seq, uint8_t *want)
{
	fill(want, len, seq);
	for (uint32_t i = 0; i < len; i++)
		if (p[i] != want[i])
			return i;
	return -1;
}

static struct sockaddr_tipc service(uint32_t type, uint32_t instance)
{
	struct sockaddr_tipc a = {
		.family = AF_TIPC,
		.addrtype = TIPC_SERVICE_ADDR,
		.addr.name.name = { .type = type, .instance = instance },
	};

	return a;
}

static int tipc_socket(int type)
{
	int fd = socket(AF_TIPC, type, 0);

	if (fd < 0)
		die("socket(AF_TIPC) (is tipc loaded? tipc-up)");
	return fd;
}

static void timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000 };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
		die("socket timeouts");
}

/* This node's TIPC address (the hash of its identity). */
static uint32_t own_node(int fd)
{
	struct sockaddr_tipc a;
	socklen_t n = sizeof(a);

	if (getsockname(fd, (struct sockaddr *)&a, &n))
		die("getsockname");
	return a.addr.id.node;
}

/* Node `node`'s identity as `tipc node set identity` gave it (or its hash). */
static const char *node_name(int fd, uint32_t node, char *buf, size_t size)
{
	struct tipc_sioc_nodeid_req r = { .peer = node };

	if (ioctl(fd, SIOCGETNODEID, &r) == 0 && r.node_id[0]) {
		snprintf(buf, size, "%.*s", TIPC_NODEID_LEN, r.node_id);
		for (char *c = buf; *c; c++)
			if (*c < ' ' || *c > '~')
				*c = '?';
	} else {
		snprintf(buf, size, "%08x", node);
	}
	return buf;
}

/*
 * Waits until service {type, instance} is published somewhere in the cluster:
 * the node of the socket bound to it. A subscription to the topology server
 * says so at once if it is, or when it comes, or times out.
 */
static uint32_t wait_for(uint32_t type, uint32_t instance)
{
	struct sockaddr_tipc top = service(TIPC_TOP_SRV, TIPC_TOP_SRV);
	struct tipc_subscr sub = {
		.seq = { .type = type, .lower = instance, .upper = instance },
		.timeout = WAIT_MS,
		.filter = TIPC_SUB_SERVICE,
	};
	struct tipc_event ev;
	int fd = tipc_socket(SOCK_SEQPACKET);
	ssize_t n;

	timeouts(fd, WAIT_MS + 5000);
	if (connect(fd, (struct sockaddr *)&top, sizeof(top)))
		die("connect to the topology server");
	if (send(fd, &sub, sizeof(sub), 0) != sizeof(sub))
		die("subscribe");
	n = recv(fd, &ev, sizeof(ev), 0);
	if (n < 0)
		die("topology event");
	if (n != sizeof(ev)) {
		fprintf(stderr, "tipc-echo: topology event of %zd bytes\n", n);
		exit(1);
	}
	if (ev.event != TIPC_PUBLISHED) {
		fprintf(stderr, "tipc-echo: service {%u,%u} not published within %d ms "
			"(event %u): is `tipc-echo serve %u` running, and the link up?\n",
			type, instance, WAIT_MS, ev.event, instance);
		exit(1);
	}
	close(fd);
	return ev.port.node;
}

/*
 * Receives one datagram on an RDM socket into buf (size bytes): its length,
 * with *from its sender. A message TIPC gave back undelivered (the server
 * gone) is an error, said as such.
 */
static ssize_t recv_msg(int fd, uint8_t *buf, size_t size, struct sockaddr_tipc *from)
{
	union {
		char buf[CMSG_SPACE(8) + CMSG_SPACE(1024) + CMSG_SPACE(16)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { .iov_base = buf, .iov_len = size };
	struct msghdr m = {
		.msg_name = from, .msg_namelen = sizeof(*from),
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cm.buf, .msg_controllen = sizeof(cm.buf),
	};
	ssize_t n = recvmsg(fd, &m, 0);

	if (n < 0)
		die(errno == EAGAIN ? "no echo within 20 s" : "recvmsg");
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
		if (h->cmsg_level == SOL_TIPC && h->cmsg_type == TIPC_ERRINFO) {
			uint32_t info[2];

			memcpy(info, CMSG_DATA(h), sizeof(info));
			fprintf(stderr, "tipc-echo: a message came back undelivered "
				"(TIPC error %u, %u bytes)\n", info[0], info[1]);
			exit(1);
		}
	}
	if (m.msg_flags & MSG_TRUNC) {
		fprintf(stderr, "tipc-echo: a message of more than %zu bytes\n", size);
		exit(3);
	}
	return n;
}

/* The server's answer to a datagram that is not what it says it is. */
static int complain(uint8_t *reply, size_t size, const char *fmt, uint32_t a, uint32_t b)
{
	int n = snprintf((char *)reply, size, "tipc-echo serve: ");

	n += snprintf((char *)reply + n, size - n, fmt, a, b);
	fprintf(stderr, "%s\n", reply);
	return n;
}

static void echo_datagram(int fd, uint8_t *buf, uint8_t *want)
{
	struct sockaddr_tipc from;
	uint8_t reply[160];
	ssize_t n = recv_msg(fd, buf, MAX_MSG + 1, &from);
	const uint8_t *out = buf;
	size_t len = n;

	if (n >= HDR) {
		uint32_t seq = get32(buf), size = get32(buf + 4);
		long bad;

		if (size != (uint32_t)n) {
			len = complain(reply, sizeof(reply), "message says %u bytes, has %u",
				       size, n);
			out = reply;
		} else if ((bad = mismatch(buf, n, seq, want)) >= 0) {
			len = complain(reply, sizeof(reply),
				       "message %u differs at byte %u", seq, bad);
			out = reply;
		}
	}
	if (sendto(fd, out, len, 0, (struct sockaddr *)&from, sizeof(from)) < 0)
		perror("tipc-echo serve: sendto");
}

/*
 * The bytes a `bw` stream carries: byte o of the stream is pattern[o % PERIOD]
 * (a prime period, so that a lost or repeated write of any power-of-two size
 * shows), compared and copied a run at a time.
 */
static uint8_t pattern[PERIOD];

static void make_pattern(void)
{
	uint32_t x = 2463534242u;

	for (int i = 0; i < PERIOD; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		pattern[i] = x >> 24;
	}
}

/* Copies (out) or checks (!out) len bytes at stream offset off: the first bad one, or -1. */
static long long stream_bytes(uint8_t *p, size_t len, uint64_t off, int out)
{
	size_t done = 0;

	while (done < len) {
		size_t k = (off + done) % PERIOD, m = PERIOD - k;

		if (m > len - done)
			m = len - done;
		if (out) {
			memcpy(p + done, pattern + k, m);
		} else if (memcmp(p + done, pattern + k, m)) {
			for (size_t i = 0; i < m; i++)
				if (p[done + i] != pattern[k + i])
					return off + done + i;
		}
		done += m;
	}
	return -1;
}

/* A sink connection: an 8-byte header (the bytes to come), then the bytes. */
struct sink {
	int on;
	uint8_t hdr[8];
	uint32_t hdr_got;
	uint64_t want, got;
	long long bad;
};

/*
 * Takes n bytes a sink connection read; 1 when the stream is whole and the
 * answer (bytes received, first bad offset or all ones) was sent.
 */
static int sink_take(int fd, struct sink *k, uint8_t *buf, size_t n)
{
	uint8_t ans[16];

	while (n && k->hdr_got < sizeof(k->hdr)) {
		k->hdr[k->hdr_got++] = *buf++;
		n--;
		if (k->hdr_got == sizeof(k->hdr))
			k->want = get32(k->hdr) | (uint64_t)get32(k->hdr + 4) << 32;
	}
	if (n) {
		long long bad = stream_bytes(buf, n, k->got, 0);

		if (bad >= 0 && k->bad < 0)
			k->bad = bad;
		k->got += n;
	}
	if (k->hdr_got < sizeof(k->hdr) || k->got < k->want)
		return 0;
	put32(ans, k->got);
	put32(ans + 4, k->got >> 32);
	put32(ans + 8, k->bad);
	put32(ans + 12, (uint64_t)k->bad >> 32);
	if (write(fd, ans, sizeof(ans)) != sizeof(ans))
		perror("tipc-echo serve: sink answer");
	return 1;
}

static int listener(int domain, int type, const void *addr, socklen_t len)
{
	int fd = domain == AF_TIPC ? tipc_socket(type) : socket(domain, type, 0);
	int one = 1;

	if (fd < 0)
		die("socket");
	if (domain == AF_INET)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, addr, len))
		die("bind");
	if (type != SOCK_RDM && listen(fd, 8))
		die("listen");
	return fd;
}

static void __attribute__((noreturn)) serve(uint32_t instance)
{
	struct sockaddr_tipc range = {
		.family = AF_TIPC,
		.addrtype = TIPC_SERVICE_RANGE,
		.scope = TIPC_CLUSTER_SCOPE,
	};
	struct sockaddr_in tcp = {
		.sin_family = AF_INET,
		.sin_port = htons(TCP_PORT),
		.sin_addr.s_addr = htonl(INADDR_ANY),
	};
	struct sockaddr_in sink = tcp;
	struct pollfd p[NLISTEN + MAX_CONNS];
	struct sink ks[NLISTEN + MAX_CONNS];
	uint8_t *buf = malloc(MAX_MSG + 1), *want = malloc(MAX_MSG + 1);
	int nfds = NLISTEN, one = 1;
	char name[40];

	if (!buf || !want)
		die("malloc");
	signal(SIGPIPE, SIG_IGN);
	range.addr.nameseq = (struct tipc_service_range){ ECHO_TYPE, instance, instance };
	p[0].fd = listener(AF_TIPC, SOCK_RDM, &range, sizeof(range));
	range.addr.nameseq.type = STREAM_TYPE;
	p[1].fd = listener(AF_TIPC, SOCK_STREAM, &range, sizeof(range));
	p[2].fd = listener(AF_INET, SOCK_STREAM, &tcp, sizeof(tcp));
	range.addr.nameseq.type = SINK_TYPE;
	p[3].fd = listener(AF_TIPC, SOCK_STREAM, &range, sizeof(range));
	sink.sin_port = htons(SINK_PORT);
	p[4].fd = listener(AF_INET, SOCK_STREAM, &sink, sizeof(sink));
	make_pattern();
	printf("tipc-echo: serving {%u,%u} (RDM), {%u,%u} (stream) on node %s, "
	       "TCP port %u; sinks {%u,%u} and TCP port %u\n", ECHO_TYPE, instance,
	       STREAM_TYPE, instance,
	       node_name(p[0].fd, own_node(p[0].fd), name, sizeof(name)), TCP_PORT,
	       SINK_TYPE, instance, SINK_PORT);
	fflush(stdout);
	for (;;) {
		for (int i = 0; i < nfds; i++)
			p[i].events = POLLIN;
		if (poll(p, nfds, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll");
		}
		if (p[0].revents)
			echo_datagram(p[0].fd, buf, want);
		for (int i = 1; i < NLISTEN; i++) {
			int c;

			if (!p[i].revents)
				continue;
			c = accept(p[i].fd, NULL, NULL);
			if (c < 0) {
				perror("tipc-echo serve: accept");
				continue;
			}
			if (nfds == NLISTEN + MAX_CONNS) {
				close(c);
				continue;
			}
			if (i == 2)
				setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			ks[nfds] = (struct sink){ .on = i >= 3, .bad = -1 };
			p[nfds++].fd = c;
		}
		for (int i = NLISTEN; i < nfds; i++) {
			ssize_t n, done = 0;

			if (!p[i].revents)
				continue;
			n = read(p[i].fd, buf, MAX_MSG);
			if (ks[i].on) {
				if (n <= 0 || sink_take(p[i].fd, &ks[i], buf, n)) {
					close(p[i].fd);
					ks[i] = ks[nfds - 1];
					p[i--] = p[--nfds];
				}
				continue;
			}
			while (n > 0 && done < n) {
				ssize_t w = write(p[i].fd, buf + done, n - done);

				if (w <= 0)
					break;
				done += w;
			}
			if (n <= 0 || done < n) {
				close(p[i].fd);
				ks[i] = ks[nfds - 1];
				p[i--] = p[--nfds];
			}
		}
	}
}

static int send_sizes(uint32_t instance, uint32_t count, int nsizes, char **sizes)
{
	struct sockaddr_tipc to = service(ECHO_TYPE, instance), from;
	uint8_t *msg = malloc(MAX_MSG + 1), *echo = malloc(MAX_MSG + 1);
	uint8_t *want = malloc(MAX_MSG + 1);
	int fd = tipc_socket(SOCK_RDM);
	uint32_t server = wait_for(ECHO_TYPE, instance);
	uint64_t bytes = 0, messages = 0;
	char name[40], link[TIPC_MAX_LINK_NAME + 16] = "";
	struct tipc_sioc_ln_req ln = { .peer = server };
	struct timespec t0, t1;

	if (!msg || !echo || !want)
		die("malloc");
	timeouts(fd, WAIT_MS);
	if (ioctl(fd, SIOCGETLINKNAME, &ln) == 0)
		snprintf(link, sizeof(link), " over link %.*s", TIPC_MAX_LINK_NAME, ln.linkname);
	printf("tipc-echo: {%u,%u} is on node %s%s\n", ECHO_TYPE, instance,
	       node_name(fd, server, name, sizeof(name)), link);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int s = 0; s < nsizes; s++) {
		uint32_t len = number(sizes[s], 1, MAX_MSG);

		for (uint32_t seq = 0; seq < count; seq++) {
			ssize_t n;
			long bad;

			fill(msg, len, seq);
			if (sendto(fd, msg, len, 0, (struct sockaddr *)&to, sizeof(to)) != len)
				die("sendto");
			n = recv_msg(fd, echo, MAX_MSG + 1, &from);
			if (from.addr.id.node != server) {
				fprintf(stderr, "tipc-echo: an echo from node %08x, not %08x\n",
					from.addr.id.node, server);
				return 3;
			}
			if (n != len) {
				fprintf(stderr, "tipc-echo: message %u of %u bytes: echo of %zd "
					"bytes: %.*s\n", seq, len, n,
					(int)(n < 160 ? n : 160), echo);
				return 3;
			}
			bad = mismatch(echo, len, seq, want);
			if (bad >= 0) {
				fprintf(stderr, "tipc-echo: message %u of %u bytes: echo differs "
					"at byte %ld (0x%02x, sent 0x%02x)\n", seq, len, bad,
					echo[bad], want[bad]);
				return 3;
			}
			bytes += len;
			messages++;
		}
		printf("tipc-echo: %u messages of %u bytes echoed and checked\n", count, len);
		fflush(stdout);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fill(msg, MAX_MSG + 1, 0);
	if (sendto(fd, msg, MAX_MSG + 1, 0, (struct sockaddr *)&to, sizeof(to)) >= 0 ||
	    errno != EMSGSIZE) {
		fprintf(stderr, "tipc-echo: a message of %u bytes was not refused with "
			"EMSGSIZE (%s)\n", MAX_MSG + 1, strerror(errno));
		return 1;
	}
	printf("tipc-echo: %u bytes refused (EMSGSIZE), as TIPC's limit is %u\n",
	       MAX_MSG + 1, MAX_MSG);
	printf("tipc-echo: %llu messages, %llu bytes to node %s and back in %.2f s, "
	       "every one checked\n", (unsigned long long)messages,
	       (unsigned long long)bytes, name,
	       (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000ull + t.tv_nsec;
}

/*
 * A connected stream (a TIPC stream or TCP) to the server: service {type, target}
 * or TCP port `port` at address `target`.
 */
static int stream_to(const char *mode, const char *target, uint32_t type, uint16_t port,
		     uint32_t *server)
{
	int fd, one = 1;

	if (strcmp(mode, "tcp") == 0) {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };

		if (inet_pton(AF_INET, target, &sin.sin_addr) != 1) {
			fprintf(stderr, "tipc-echo: not an IPv4 address: %s\n", target);
			exit(2);
		}
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			die("socket");
		timeouts(fd, WAIT_MS);
		if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)))
			die("connect over TCP");
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	} else {
		uint32_t instance = number(target, 0, UINT32_MAX);
		struct sockaddr_tipc to = service(type, instance);

		*server = wait_for(type, instance);
		fd = tipc_socket(SOCK_STREAM);
		timeouts(fd, WAIT_MS);
		if (connect(fd, (struct sockaddr *)&to, sizeof(to)))
			die("connect over TIPC");
	}
	return fd;
}

static int latency(const char *mode, const char *target, uint32_t rounds)
{
	int rdm = strcmp(mode, "rdm") == 0;
	uint64_t *rtt = malloc(rounds * sizeof(*rtt)), sum = 0;
	uint32_t server = 0;
	struct sockaddr_tipc to = { 0 }, from;
	int fd;

	if (!rtt)
		die("malloc");
	if (rdm) {
		uint32_t instance = number(target, 0, UINT32_MAX);

		to = service(ECHO_TYPE, instance);
		server = wait_for(ECHO_TYPE, instance);
		fd = tipc_socket(SOCK_RDM);
		timeouts(fd, WAIT_MS);
	} else if (strcmp(mode, "stream") == 0 || strcmp(mode, "tcp") == 0) {
		fd = stream_to(mode, target, STREAM_TYPE, TCP_PORT, &server);
	} else {
		usage();
	}
	for (uint32_t r = 0; r < WARMUP + rounds; r++) {
		uint8_t out = r, in;
		uint64_t t = now_ns();
		ssize_t n;

		if (rdm) {
			if (sendto(fd, &out, 1, 0, (struct sockaddr *)&to, sizeof(to)) != 1)
				die("sendto");
			n = recv_msg(fd, &in, 1, &from);
			if (from.addr.id.node != server)
				n = -1;
		} else {
			if (write(fd, &out, 1) != 1)
				die("write");
			n = read(fd, &in, 1);
			if (n < 0)
				die(errno == EAGAIN ? "no echo within 20 s" : "read");
		}
		if (n != 1 || in != out) {
			fprintf(stderr, "tipc-echo: round %u: a wrong echo (%zd bytes)\n", r, n);
			return 3;
		}
		if (r >= WARMUP) {
			rtt[r - WARMUP] = now_ns() - t;
			sum += rtt[r - WARMUP];
		}
	}
	qsort(rtt, rounds, sizeof(*rtt), cmp_u64);
	{
		double mean = sum / 1e3 / rounds;
		double median = (rounds % 2 ? rtt[rounds / 2] :
				 (rtt[rounds / 2 - 1] + rtt[rounds / 2]) / 2.0) / 1e3;

		printf("LAT mode=%s rounds=%u rtt_mean_us=%.1f rtt_median_us=%.1f "
		       "oneway_mean_us=%.1f oneway_median_us=%.1f\n", mode, rounds, mean,
		       median, mean / 2, median / 2);
	}
	return 0;
}

/* Reads exactly len bytes, or dies saying what came. */
static void read_all(int fd, uint8_t *p, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);

		if (n < 0)
			die(errno == EAGAIN ? "no answer from the sink within 20 s" : "read");
		if (n == 0) {
			fprintf(stderr, "tipc-echo: the sink closed after %zu of %zu answer bytes\n",
				got, len);
			exit(1);
		}
		got += n;
	}
}

static int bandwidth(const char *mode, const char *target, uint32_t size, uint64_t bytes)
{
	uint64_t count = bytes / size, total = count * size, got, t0, t1;
	uint8_t *msg = malloc(size), hdr[8], ans[16];
	uint32_t server = 0;
	long long bad;
	double secs;
	int fd;

	if (!msg)
		die("malloc");
	if (count == 0) {
		fprintf(stderr, "tipc-echo: BYTES below SIZE\n");
		return 2;
	}
	if (strcmp(mode, "stream") && strcmp(mode, "tcp"))
		usage();
	signal(SIGPIPE, SIG_IGN);
	make_pattern();
	fd = stream_to(mode, target, SINK_TYPE, SINK_PORT, &server);
	put32(hdr, total);
	put32(hdr + 4, total >> 32);
	t0 = now_ns();
	if (write(fd, hdr, sizeof(hdr)) != sizeof(hdr))
		die("write");
	for (uint64_t off = 0; off < total; off += size) {
		stream_bytes(msg, size, off, 1);
		/* After a short write, the rest of the message. */
		for (size_t done = 0; done < size;) {
			ssize_t n = write(fd, msg + done, size - done);

			if (n <= 0)
				die(n < 0 && errno == EAGAIN ? "a write made no progress in 20 s" :
				    "write");
			done += n;
		}
	}
	read_all(fd, ans, sizeof(ans));
	t1 = now_ns();
	got = get32(ans) | (uint64_t)get32(ans + 4) << 32;
	bad = (long long)(get32(ans + 8) | (uint64_t)get32(ans + 12) << 32);
	if (got != total || bad >= 0) {
		fprintf(stderr, "tipc-echo: the sink took %llu of %llu bytes; first wrong byte "
			"at %lld\n", (unsigned long long)got, (unsigned long long)total, bad);
		return 3;
	}
	secs = (t1 - t0) / 1e9;
	printf("BW mode=%s size=%u bytes=%llu secs=%.6f mb_s=%.2f checked=1\n", mode, size,
	       (unsigned long long)total, secs, total / 1e6 / secs);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "serve") == 0)
		serve(number(argv[2], 0, UINT32_MAX));
	if (argc >= 5 && strcmp(argv[1], "send") == 0)
		return send_sizes(number(argv[2], 0, UINT32_MAX),
				  number(argv[3], 1, 1000000), argc - 4, argv + 4);
	if (argc == 5 && strcmp(argv[1], "lat") == 0)
		return latency(argv[2], argv[3], number(argv[4], 1, 10000000));
	if (argc == 6 && strcmp(argv[1], "bw") == 0)
		return bandwidth(argv[2], argv[3], number(argv[4], 1, 1 << 24),
				 number(argv[5], 1, 1ull << 36));
	usage();
}
