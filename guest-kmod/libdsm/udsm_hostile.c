// SPDX-License-Identifier: GPL-2.0
/*
 * udsm_hostile: the user-level DSM's message checks, on the host, without
 * a device: udsm.c is included whole so its handlers can be called with
 * forged messages. Node 1 of 2, 8 pages. Each hostile case runs in a child
 * that must die with a protocol error (exit 3 from dsm_die here, and the
 * message on stderr); a valid transaction run through the self queue must
 * end in the state the protocol says. Prints "udsm-hostile ok CASES" and
 * exits 0 when every case held; built and run by tests/tests/udsm_hostile.rs
 * (linked with unresolved verbs symbols ignored: no case reaches them).
 */
#include "udsm.c"
#include <sys/wait.h>

void dsm_die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	_exit(3);
}

static uint8_t rbuf[U_SLOT];

static void setup(void)
{
	unsigned p;

	u.self = 1;
	u.nodes = 2;
	u.npages = 8;
	u.timeout_s = 1;
	u.size = (size_t)u.npages * U_PAGE;
	u.app = mmap(NULL, u.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	u.svc = mmap(NULL, u.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (u.app == MAP_FAILED || u.svc == MAP_FAILED)
		dsm_die("mmap");
	u.prot = zalloc(u.npages);
	u.want = zalloc(u.npages);
	u.own = zalloc(u.npages);
	u.req_ns = zalloc(u.npages * sizeof(*u.req_ns));
	u.mgr = zalloc(u.npages * sizeof(*u.mgr));
	for (p = 0; p < u.npages; p++) {
		u.mgr[p].owner = manager(p);
		if (manager(p) == u.self) {
			u.own[p] = 1;
			set_prot(p, U_RW);
		}
	}
	u.selfq = zalloc(U_SELFQ * sizeof(*u.selfq));
	pthread_mutex_init(&u.lock, NULL);
	pthread_cond_init(&u.cv, NULL);
	u.peer[2].rbuf = rbuf;
	in_service = 1;
}

/* Handles the self queue as the service thread would (no CQ here). */
static void run_selfq(void)
{
	struct u_msg m;

	while (u.sq_n) {
		m = u.selfq[u.sq_head];
		u.sq_head = (u.sq_head + 1) % U_SELFQ;
		u.sq_n--;
		handle(&m, NULL);
	}
}

struct hostile {
	const char *name;
	struct u_msg m;
	uint32_t byte_len;	/* as received from node 2 (0: handed to handle() directly) */
	const char *want;	/* in the error */
};

static const struct hostile cases[] = {
	{ "page out of range", { U_REQ_READ, 2, 8 }, 0, "no such page" },
	{ "huge page number", { U_FWD_WRITE, 2, 0xffffffff, 1 }, 0, "no such page" },
	{ "request to a non-manager", { U_REQ_WRITE, 2, 1 }, 0, "not the page's manager" },
	{ "data nobody asked for", { U_DATA_READ, 2, 3, 0, U_F_DATA, U_PAGE }, 0,
	  "no such request" },
	{ "page data on a control message", { U_INV, 2, 1, 0, 0, U_PAGE }, 0,
	  "data where none belongs" },
	{ "forward for a page not ours", { U_FWD_READ, 2, 1, 2 }, 0, "not ours" },
	{ "forward to a bad node", { U_FWD_READ, 1, 0, 9 }, 0, "bad requester" },
	{ "ack with no transaction", { U_INV_ACK, 2, 0 }, 0, "no transaction open" },
	{ "confirm with no transaction", { U_CONFIRM_WRITE, 2, 2 }, 0, "no transaction open" },
	{ "invalidation from a non-manager", { U_INV, 2, 0 }, 0, "not from the manager" },
	{ "barrier from the future", { U_BAR_ENTER, 2, 5 }, 0, "next generation" },
	{ "barrier release unasked", { U_BAR_GO, 1, 1 }, 0, "generation we wait for" },
	{ "lock id out of range", { U_LOCK_REQ, 2, DSM_LOCKS }, 0, "no such lock" },
	{ "unlock by a non-holder", { U_UNLOCK, 2, 0 }, 0, "does not hold" },
	{ "lock grant unasked", { U_LOCK_GRANT, 2, 1 }, 0, "no request of ours" },
	{ "unknown type", { 99, 2, 0 }, 0, "unknown type" },
	{ "short message", { U_REQ_READ, 2, 0 }, 8, "8-byte message" },
	{ "sender not the QP's node", { U_REQ_READ, 1, 0 }, sizeof(struct u_msg),
	  "came from node 2" },
	{ "length not the header's", { U_DATA_READ, 2, 0, 0, U_F_DATA, U_PAGE },
	  sizeof(struct u_msg) + 100, "came from node 2" },
	{ "page-sized length on a short message", { U_DATA_READ, 2, 0, 0, U_F_DATA, 100 },
	  sizeof(struct u_msg) + 100, "came from node 2" },
};

static int run_case(const struct hostile *c)
{
	int fds[2], status;
	char err[512] = "";
	ssize_t n;
	pid_t pid;

	if (pipe(fds))
		return -1;
	pid = fork();
	if (!pid) {
		dup2(fds[1], 2);
		if (c->byte_len) {
			struct ibv_wc wc = { .wr_id = 2ULL << 16, .opcode = IBV_WC_RECV,
					     .byte_len = c->byte_len };

			memcpy(rbuf, &c->m, sizeof(c->m));
			handle_recv(&wc);
		} else {
			handle(&c->m, c->m.len ? rbuf : NULL);
		}
		_exit(0);	/* accepted: the case fails */
	}
	close(fds[1]);
	n = read(fds[0], err, sizeof(err) - 1);
	err[n > 0 ? n : 0] = 0;
	close(fds[0]);
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 3 || !strstr(err, c->want)) {
		fprintf(stderr, "udsm-hostile: %s: status %d, stderr \"%s\", want \"%s\"\n",
			c->name, status, err, c->want);
		return -1;
	}
	return 0;
}

int main(void)
{
	unsigned i, bad = 0;
	struct u_msg m = { .type = U_REQ_WRITE, .from = 1, .arg = 4 };

	setup();
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		bad += run_case(&cases[i]) != 0;

	/*
	 * A valid transaction, for contrast: node 1 read-copies and then
	 * write-requests page 4 (its own, it manages it): the manager's queue
	 * and the self queue take it to the end, the page writable, the
	 * manager idle with node 1 as owner.
	 */
	set_prot(4, U_READ);
	u.want[4] = U_RW;
	handle(&m, NULL);
	run_selfq();
	if (u.prot[4] != U_RW || u.want[4] || !u.own[4] || u.mgr[4].busy ||
	    u.mgr[4].owner != 1 || u.st.msgs_sent) {
		fprintf(stderr, "udsm-hostile: a valid write request did not complete\n");
		bad++;
	}
	/* The same request twice while the first is open is refused. */
	u.want[6] = U_RW;
	m.arg = 6;
	u.mgr[6].owner = 2;	/* its owner elsewhere: the transaction stays open */
	u.mgr[6].busy = 1;
	u.mgr[6].req = 2;
	m.from = 2;
	if (run_case(&(struct hostile){ "second request while open", m, 0, "a second request" }))
		bad++;
	if (bad) {
		fprintf(stderr, "udsm-hostile: %u case(s) failed\n", bad);
		return 1;
	}
	printf("udsm-hostile ok %zu\n", sizeof(cases) / sizeof(cases[0]) + 2);
	return 0;
}
