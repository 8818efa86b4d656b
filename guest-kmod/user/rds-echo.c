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
 *   rds-echo lat LOCAL ADDR PORT ROUNDS
 *	ROUNDS one-byte round trips (after 20 not counted) to ADDR:PORT, one
 *	message in flight, every echo checked; prints the round trip's mean and
 *	median in microseconds, and half of each, on a line starting "LAT " (as
 *	tipc-echo lat does)
 *   rds-echo rdma LOCAL ADDR PORT COUNT SIZE...
 *	RDS's RDMA: the server registers SIZE bytes of its memory for this
 *	client (RDS_CMSG_RDMA_MAP on its reply, which rds_ib serves with a
 *	fast-registration MR posted on the connection's QP; the client finds
 *	the cookie in RDS_CMSG_RDMA_DEST); then COUNT times an RDMA WRITE of fresh bytes into it (the
 *	server checks them when the message sent behind the WRITE arrives) and
 *	an RDMA READ of bytes the server wrote there (checked here once RDS
 *	reports the READ done); the server serves this to one client at a time
 *   rds-echo atomic LOCAL ADDR PORT
 *	RDS's atomics on 8 bytes the server registered the same way: exit 0
 *	when checked, 3 when the server's HCA refused them for their key
 *	(what Linux's rds_ib registers allows no remote atomics; see atomics())
 *
 * The socket is held to the InfiniBand transport (SO_RDS_TRANSPORT), so a
 * run never passes over loopback or TCP in its place. Exit 0 only when every
 * echo was checked; otherwise the first mismatch or error is printed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/rds.h>

/* RDS's largest message (RDS_MAX_MSG_SIZE). */
#define MAX_MSG		(1 << 20)
#define MAX_WINDOW	64
#define REPLY_WAIT_MS	20000

/* What the RDMA mode's client asks of the server, and the server's answer: a message of
 * exactly this size that starts with CTL_MAGIC (an echoed message never does: its bytes
 * are pattern()'s). */
#define CTL_MAGIC	0x2173647262616368ull	/* "hcabrds!" */
enum { CTL_MAP = 1, CTL_FILL, CTL_CHECK, CTL_NOOP, CTL_REPLY };

struct ctl {
	uint64_t magic;
	uint32_t kind;
	uint32_t len;
	uint32_t seq;
	/* CTL_REPLY: 0, a negative errno, or 1 + the first byte that differs */
	int32_t result;
	uint64_t cookie;
};

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

static void send_all(int fd, const void *p, size_t len, const struct sockaddr_in *to)
{
	/* The peer's window bounds what is queued here; retry a full queue. */
	while (sendto(fd, p, len, 0, (const struct sockaddr *)to, sizeof(*to)) < 0) {
		if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR)
			die("sendto");
		usleep(1000);
	}
}

/* The server's side of the RDMA mode: memory registered for the client's RDMA. */
static uint8_t *region;
static uint64_t region_cookie;

/* Sends control message c to `to` with one RDS control message (type, args) on it. */
static void send_with(int fd, const struct sockaddr_in *to, int type, const void *args,
		      size_t n, const struct ctl *c)
{
	union {
		char buf[CMSG_SPACE(sizeof(struct rds_atomic_args))];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { .iov_base = (void *)c, .iov_len = sizeof(*c) };
	struct msghdr m = {
		.msg_name = (void *)to, .msg_namelen = sizeof(*to),
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cm.buf, .msg_controllen = CMSG_SPACE(n),
	};
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);

	h->cmsg_level = SOL_RDS;
	h->cmsg_type = type;
	h->cmsg_len = CMSG_LEN(n);
	memcpy(CMSG_DATA(h), args, n);
	while (sendmsg(fd, &m, 0) < 0) {
		if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR)
			die("sendmsg");
		usleep(1000);
	}
}

/* Registers len bytes of the region for the peer at `to` and replies: the reply carries
 * the registration (RDS_CMSG_RDMA_MAP), so that the peer receives its cookie. rds_ib
 * registers through the connection's QP; RDS_GET_MR, which has none, is refused
 * (EOPNOTSUPP) where the device has only fast registration. */
static int map_for(int fd, uint32_t len, const struct sockaddr_in *to)
{
	struct ctl r = { .magic = CTL_MAGIC, .kind = CTL_REPLY };
	struct rds_get_mr_args mr = {
		.vec = { .addr = (uintptr_t)region, .bytes = len },
		.cookie_addr = (uintptr_t)&region_cookie,
		.flags = RDS_RDMA_READWRITE,
	};
	struct rds_free_mr_args old = { .cookie = region_cookie };

	if (region_cookie && setsockopt(fd, SOL_RDS, RDS_FREE_MR, &old, sizeof(old)))
		die("RDS_FREE_MR");
	region_cookie = 0;
	send_with(fd, to, RDS_CMSG_RDMA_MAP, &mr, sizeof(mr), &r);
	return 1;
}

/* Answers a control message; 0 if it was not one. */
static int control(int fd, const uint8_t *msg, ssize_t len, const struct sockaddr_in *from)
{
	struct ctl c, r = { .magic = CTL_MAGIC, .kind = CTL_REPLY };
	long bad;

	if (len != sizeof(c))
		return 0;
	memcpy(&c, msg, sizeof(c));
	if (c.magic != CTL_MAGIC)
		return 0;
	if (c.len > MAX_MSG) {
		r.result = -EINVAL;
	} else if (c.kind == CTL_MAP) {
		return map_for(fd, c.len, from);
	} else if (c.kind == CTL_FILL) {
		fill(region, c.seq, c.len);
	} else if (c.kind == CTL_CHECK) {
		bad = mismatch(region, c.seq, c.len);
		r.result = bad < 0 ? 0 : bad + 1;
	} else if (c.kind == CTL_NOOP) {
		return 1;
	} else {
		r.result = -EINVAL;
	}
	send_all(fd, &r, sizeof(r), from);
	return 1;
}

static int serve(const char *addr, int port)
{
	int fd = rds_socket(addr, port);
	uint8_t *buf = malloc(MAX_MSG);
	unsigned long n = 0;

	region = aligned_alloc(4096, MAX_MSG);
	if (!buf || !region)
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
		if (!control(fd, buf, got, &from))
			send_all(fd, buf, got, &from);
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

/* Says what came instead of message seq: its first bytes, and which other messages of
 * this length (as an earlier run of this tool numbered them) it is byte for byte: a
 * message delivered twice or late shows as one of those, a corrupted one as none. */
static void tell_what_came(const uint8_t *buf, uint32_t seq, uint32_t len)
{
	uint32_t n = len < 16 ? len : 16, found = 0;

	fprintf(stderr, "rds-echo: got");
	for (uint32_t i = 0; i < n; i++)
		fprintf(stderr, " %02x", buf[i]);
	fprintf(stderr, ", expected");
	for (uint32_t i = 0; i < n; i++)
		fprintf(stderr, " %02x", pattern(seq, len, i));
	fprintf(stderr, "; it is message");
	for (uint32_t other = 0; other < 4096 && found < 8; other++) {
		if (other != seq && mismatch(buf, other, len) < 0) {
			fprintf(stderr, " %u", other);
			found++;
		}
	}
	fprintf(stderr, found ? " of this size\n" : " none of 0..4095 of this size\n");
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
		tell_what_came(buf, seq, len);
		exit(1);
	}
}

/*
 * A send that RDS holds (its send queue full, or the peer's port marked congested in the
 * connection's congestion map) ends the ping after REPLY_WAIT_MS with a message, rather
 * than waiting for ever: SIGALRM interrupts a sendto blocked in the kernel.
 */
static void send_stalled(int sig)
{
	static const char msg[] = "rds-echo: a send made no progress in 20000 ms "
				  "(send queue full or the peer's port congested)\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(4);
	_exit(4);
}

static int ping(const char *local, const char *addr, int port, int count, int window,
		char **sizes, int nsizes)
{
	struct sockaddr_in to = inet(addr, port);
	int fd = rds_socket(local, 0);
	uint8_t *out = malloc(MAX_MSG), *in = malloc(MAX_MSG);
	uint32_t seq = 0;
	unsigned long long bytes = 0;
	int stalling = 0;

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
				/* Armed once per stall: progress disarms it. */
				if (!stalling) {
					signal(SIGALRM, send_stalled);
					alarm(REPLY_WAIT_MS / 1000);
					stalling = 1;
				}
				if (sendto(fd, out, len, 0, (struct sockaddr *)&to, sizeof(to)) < 0) {
					if (errno != ENOBUFS && errno != EAGAIN)
						die("sendto");
					break;	/* queue full: take an echo first */
				}
				alarm(0);
				stalling = 0;
				sent++;
			}
			if (sent == done) {
				/* Nothing in flight and nothing sent: the alarm bounds this. */
				usleep(1000);
				continue;
			}
			alarm(0);
			stalling = 0;
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

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#define WARMUP	20

static int latency(const char *local, const char *addr, int port, int rounds)
{
	struct sockaddr_in to = inet(addr, port);
	int fd = rds_socket(local, 0);
	uint8_t *in = malloc(MAX_MSG), out;
	double *rtt = malloc(rounds * sizeof(*rtt)), sum = 0, mean, median;

	if (!in || !rtt)
		die("malloc");
	for (int r = 0; r < WARMUP + rounds; r++) {
		double t = now_us();

		fill(&out, r, 1);
		send_all(fd, &out, 1, &to);
		take_echo(fd, in, r, 1);
		if (r >= WARMUP) {
			rtt[r - WARMUP] = now_us() - t;
			sum += rtt[r - WARMUP];
		}
	}
	qsort(rtt, rounds, sizeof(*rtt), cmp_double);
	mean = sum / rounds;
	median = rounds % 2 ? rtt[rounds / 2] : (rtt[rounds / 2 - 1] + rtt[rounds / 2]) / 2;
	printf("LAT mode=rds rounds=%d rtt_mean_us=%.1f rtt_median_us=%.1f "
	       "oneway_mean_us=%.1f oneway_median_us=%.1f\n", rounds, mean, median,
	       mean / 2, median / 2);
	return 0;
}

/* The cookie the last message received carried (RDS_CMSG_RDMA_DEST), or 0. */
static uint64_t dest_cookie;

/* Waits for a message or an RDMA notification. Returns the message's length, or -1 for a
 * notification (its token and status in *token and *status). */
static ssize_t take(int fd, void *buf, size_t cap, uint64_t *token, int *status)
{
	char cbuf[CMSG_SPACE(sizeof(struct rds_rdma_notify)) * 4];

	dest_cookie = 0;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr m = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct cmsghdr *c;
	ssize_t got;

	if (poll(&p, 1, REPLY_WAIT_MS) != 1) {
		fprintf(stderr, "rds-echo: nothing arrived in %d ms\n", REPLY_WAIT_MS);
		exit(1);
	}
	got = recvmsg(fd, &m, 0);
	if (got < 0)
		die("recvmsg");
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		struct rds_rdma_notify n;

		if (c->cmsg_level == SOL_RDS && c->cmsg_type == RDS_CMSG_RDMA_DEST)
			memcpy(&dest_cookie, CMSG_DATA(c), sizeof(dest_cookie));
		if (c->cmsg_level != SOL_RDS || c->cmsg_type != RDS_CMSG_RDMA_STATUS)
			continue;
		memcpy(&n, CMSG_DATA(c), sizeof(n));
		*token = n.user_token;
		*status = n.status;
		return -1;
	}
	return got;
}

/* Says where a READ's bytes differ from message seq's and what they are instead: zeros
 * (never written: the buffer was cleared before the READ), or an earlier message's. */
static void explain(const uint8_t *buf, uint32_t seq, uint32_t len)
{
	long first = mismatch(buf, seq, len), last = first, bad = 0;

	for (uint32_t i = first; i < len; i++)
		if (buf[i] != pattern(seq, len, i)) {
			last = i;
			bad++;
		}
	fprintf(stderr, "rds-echo: RDMA READ %u (%u bytes) differs in %ld bytes from %ld to %ld;",
		seq, len, bad, first, last);
	for (uint32_t i = first; i < len && i < (uint32_t)first + 8; i++)
		fprintf(stderr, " %02x", buf[i]);
	for (uint32_t back = 1; back <= 4 && back < seq; back++) {
		int same = 1;

		for (long i = first; i <= last && same; i++)
			if (buf[i] != pattern(seq - back, len, i) && buf[i] != pattern(seq, len, i))
				same = 0;
		if (same)
			fprintf(stderr, " (message %u's bytes)", seq - back);
	}
	fprintf(stderr, "\n");
}

/* A control message to the server and its reply (no RDMA outstanding meanwhile). */
static struct ctl ask(int fd, const struct sockaddr_in *to, uint32_t kind, uint32_t seq,
		      uint32_t len)
{
	struct ctl c = { .magic = CTL_MAGIC, .kind = kind, .len = len, .seq = seq };
	uint64_t token;
	int status;

	send_all(fd, &c, sizeof(c), to);
	if (take(fd, &c, sizeof(c), &token, &status) != sizeof(c) || c.magic != CTL_MAGIC ||
	    c.kind != CTL_REPLY) {
		fprintf(stderr, "rds-echo: the server's reply to request %u is not one\n", kind);
		exit(1);
	}
	c.cookie = dest_cookie;
	return c;
}

/* Has the server map len bytes of its memory for this client; the cookie, or exits. */
static uint64_t map_remote(int fd, const struct sockaddr_in *to, uint32_t len)
{
	struct ctl r = ask(fd, to, CTL_MAP, 0, len);

	if (!r.result && !r.cookie)
		r.result = -ENOKEY;
	if (r.result) {
		fprintf(stderr, "rds-echo: the server could not register %u bytes: %s\n",
			len, strerror(-r.result));
		exit(1);
	}
	return r.cookie;
}

/* Sends control message c with an RDMA op on the server's registered memory riding
 * before it: a WRITE from local, or a READ into it. RDS notifies the op's end. */
static void send_rdma(int fd, const struct sockaddr_in *to, uint64_t cookie, void *local,
		      uint32_t len, int write, uint64_t token, const struct ctl *c)
{
	struct rds_iovec lv = { .addr = (uintptr_t)local, .bytes = len };
	struct rds_rdma_args a = {
		.cookie = cookie,
		/* The registered range starts at remote address 0 plus the cookie's offset. */
		.remote_vec = { .addr = 0, .bytes = len },
		.local_vec_addr = (uintptr_t)&lv,
		.nr_local = 1,
		.flags = RDS_RDMA_NOTIFY_ME | (write ? RDS_RDMA_READWRITE : 0),
		.user_token = token,
	};

	send_with(fd, to, RDS_CMSG_RDMA_ARGS, &a, sizeof(a), c);
}

/* Takes what arrives until the notification for token and, if want_reply, a control
 * reply (its result must be 0). Returns the op's RDS status (RDS_RDMA_SUCCESS or why not). */
static int finish_rdma(int fd, uint64_t token, int want_reply, const char *what,
		       uint32_t seq, uint32_t len)
{
	int notified = 0, replied = !want_reply, op_status = RDS_RDMA_SUCCESS;

	while (!notified || !replied) {
		struct ctl r;
		uint64_t t = 0;
		int status = 0;
		ssize_t got = take(fd, &r, sizeof(r), &t, &status);

		if (got < 0) {
			if (t != token) {
				fprintf(stderr, "rds-echo: a notification for %llu, not %llu\n",
					(unsigned long long)t, (unsigned long long)token);
				exit(1);
			}
			op_status = status;
			notified = 1;
			/* A failed op's message is not delivered: no reply comes. */
			if (status != RDS_RDMA_SUCCESS)
				replied = 1;
		} else if (got == sizeof(r) && r.magic == CTL_MAGIC && r.kind == CTL_REPLY) {
			if (r.result) {
				fprintf(stderr, "rds-echo: RDMA %s %u (%u bytes): the server says %d\n",
					what, seq, len, r.result);
				exit(1);
			}
			replied = 1;
		} else {
			fprintf(stderr, "rds-echo: an unexpected %zd-byte message\n", got);
			exit(1);
		}
	}
	return op_status;
}

/* Exits unless an RDMA op ended well. */
static void must_succeed(int status, const char *what, uint32_t seq, uint32_t len)
{
	if (status == RDS_RDMA_SUCCESS)
		return;
	fprintf(stderr, "rds-echo: RDMA %s %u (%u bytes) failed: RDS status %d\n",
		what, seq, len, status);
	exit(1);
}

/* An RDS atomic (fetch-and-add of a, or compare a and swap b) on the first 8 bytes of
 * the server's registered memory; the value there before lands in *old. Returns the op's
 * RDS status. */
static int atomic_op(int fd, const struct sockaddr_in *to, uint64_t cookie, int type,
		     uint64_t a, uint64_t b, uint64_t *old, uint32_t token)
{
	struct ctl c = { .magic = CTL_MAGIC, .kind = CTL_NOOP, .seq = token };
	struct rds_atomic_args x = {
		.cookie = cookie,
		.local_addr = (uintptr_t)old,
		.remote_addr = 0,
		.flags = RDS_RDMA_NOTIFY_ME,
		.user_token = token,
	};

	if (type == RDS_CMSG_ATOMIC_FADD) {
		x.fadd.add = a;
	} else {
		x.cswp.compare = a;
		x.cswp.swap = b;
	}
	*old = ~0ull;
	send_with(fd, to, type, &x, sizeof(x), &c);
	return finish_rdma(fd, token, 0, "atomic", token, 8);
}

/*
 * RDS atomics on 8 bytes of the server's memory, registered for this client: fetch-and-add,
 * then a compare-and-swap that matches and one that does not, each checked, then an RDMA
 * READ of the result. RDS posts them as masked atomics. Exit 0 when all were checked; 3
 * when the server's HCA refused the first for its key (RDS_RDMA_REMOTE_ERROR): Linux's
 * rds_ib registers memory for RDMA with local write and remote read and write only
 * (IB_WR_REG_MR, access 0x7), and IB executes an atomic only through a key that allows it.
 */
static int atomics(const char *local, const char *addr, int port)
{
	struct sockaddr_in to = inet(addr, port);
	int fd = rds_socket(local, 0);
	uint64_t *buf = aligned_alloc(4096, 4096);
	uint64_t v, add = 0x1111111111111111ull, swap = 0x5eed5eed5eed5eedull, got = 0;
	struct ctl c = { .magic = CTL_MAGIC, .kind = CTL_NOOP };
	uint32_t seq = 1;
	uint64_t cookie;
	uint8_t first[8];
	int status;

	if (!buf)
		die("malloc");
	cookie = map_remote(fd, &to, 8);
	if (ask(fd, &to, CTL_FILL, seq, 8).result) {
		fprintf(stderr, "rds-echo: the server could not fill 8 bytes\n");
		return 1;
	}
	fill(first, seq, 8);	/* what the server's 8 bytes hold now */
	memcpy(&v, first, 8);
	status = atomic_op(fd, &to, cookie, RDS_CMSG_ATOMIC_FADD, add, 0, buf, ++seq);
	if (status == RDS_RDMA_REMOTE_ERROR) {
		printf("rds-echo: atomic: remote access error: the server's key does not allow "
		       "remote atomics\n");
		return 3;
	}
	must_succeed(status, "fetch-and-add", seq, 8);
	got = *buf;
	if (got == v) {
		status = atomic_op(fd, &to, cookie, RDS_CMSG_ATOMIC_CSWP, v + add, swap, buf, ++seq);
		must_succeed(status, "compare-and-swap", seq, 8);
		got = *buf;
	}
	if (got == v + add) {
		status = atomic_op(fd, &to, cookie, RDS_CMSG_ATOMIC_CSWP, v, 0, buf, ++seq);
		must_succeed(status, "compare-and-swap", seq, 8);
		got = *buf;
	}
	if (got != swap) {
		fprintf(stderr, "rds-echo: atomic %u saw %#llx (from %#llx)\n", seq,
			(unsigned long long)got, (unsigned long long)v);
		return 1;
	}
	*buf = 0;
	c.seq = ++seq;
	send_rdma(fd, &to, cookie, buf, 8, 0, seq, &c);
	must_succeed(finish_rdma(fd, seq, 0, "READ", seq, 8), "READ", seq, 8);
	if (*buf != swap) {
		fprintf(stderr, "rds-echo: after the atomics the server's memory holds %#llx\n",
			(unsigned long long)*buf);
		return 1;
	}
	printf("rds-echo: atomic: fetch-and-add and compare-and-swap verified\n");
	return 0;
}

static int rdma(const char *local, const char *addr, int port, int count, char **sizes,
		int nsizes)
{
	struct sockaddr_in to = inet(addr, port);
	int fd = rds_socket(local, 0);
	uint8_t *buf = aligned_alloc(4096, MAX_MSG);
	uint32_t seq = 0;
	unsigned long long bytes = 0;

	if (!buf)
		die("malloc");
	for (int s = 0; s < nsizes; s++) {
		long len = strtol(sizes[s], NULL, 0);
		uint64_t cookie;
		double t;

		if (len < 1 || len > MAX_MSG || count < 1) {
			fprintf(stderr, "rds-echo: COUNT >= 1 and SIZE in 1..%d\n", MAX_MSG);
			return 2;
		}
		cookie = map_remote(fd, &to, len);
		t = now_us();
		for (int i = 0; i < count; i++) {
			struct ctl c = { .magic = CTL_MAGIC, .kind = CTL_CHECK, .len = len };

			/* WRITE: the server checks its memory when the message behind it lands. */
			c.seq = ++seq;
			fill(buf, seq, len);
			send_rdma(fd, &to, cookie, buf, len, 1, seq, &c);
			must_succeed(finish_rdma(fd, seq, 1, "WRITE", seq, len), "WRITE", seq, len);
			/* READ: of what the server wrote there, checked here once done. */
			seq++;
			if (ask(fd, &to, CTL_FILL, seq, len).result) {
				fprintf(stderr, "rds-echo: the server could not fill\n");
				return 1;
			}
			memset(buf, 0, len);
			c.kind = CTL_NOOP;
			c.seq = seq;
			send_rdma(fd, &to, cookie, buf, len, 0, seq, &c);
			must_succeed(finish_rdma(fd, seq, 0, "READ", seq, len), "READ", seq, len);
			if (mismatch(buf, seq, len) >= 0) {
				explain(buf, seq, len);
				/* RDS also reports an RDMA op done when the peer's RDS acknowledges
				 * the message sent behind it, which under loss can come before the
				 * op's last responses land: look again. */
				sleep(5);
				if (mismatch(buf, seq, len) < 0)
					fprintf(stderr, "rds-echo: 5 s later every byte of READ %u is "
						"there: RDS reported it done before its data arrived\n",
						seq);
				return 1;
			}
		}
		t = now_us() - t;
		bytes += 2ull * count * len;
		printf("rds-echo: %d RDMA WRITEs and READs of %ld bytes verified, %.1f us per pair\n",
		       count, len, t / count);

	}
	printf("rds-echo: %u RDMA operations, %llu bytes, every one verified\n", seq, bytes);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "serve"))
		return serve(argv[2], atoi(argv[3]));
	if (argc >= 8 && !strcmp(argv[1], "ping"))
		return ping(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
			    argv + 7, argc - 7);
	if (argc == 6 && !strcmp(argv[1], "lat") && atoi(argv[5]) >= 1)
		return latency(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
	if (argc == 5 && !strcmp(argv[1], "atomic"))
		return atomics(argv[2], argv[3], atoi(argv[4]));
	if (argc >= 7 && !strcmp(argv[1], "rdma"))
		return rdma(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv + 6, argc - 6);
	fprintf(stderr,
		"usage: rds-echo serve ADDR PORT\n"
		"       rds-echo ping LOCAL ADDR PORT COUNT WINDOW SIZE...\n"
		"       rds-echo lat LOCAL ADDR PORT ROUNDS\n"
		"       rds-echo rdma LOCAL ADDR PORT COUNT SIZE...\n"
		"       rds-echo atomic LOCAL ADDR PORT\n");
	return 2;
}
