// SPDX-License-Identifier: GPL-2.0
/*
 * pma-query: asks a port's Performance Management agent for its counters, over
 * QP1 through ib_umad, as a performance manager does. Debian's perfquery
 * cannot here: it opens the SMI class too, and hcab0 has no QP0.
 *
 *   pma-query LID	ClassPortInfo's capability mask, then PortCounters and
 *			PortCountersExtended of port 1 at LID, one "name value"
 *			per line
 *   pma-query -r LID	the same, after resetting every counter (a Set of
 *			PortCounters and of PortCountersExtended, all selected)
 *
 * Exit 0 when every answer came back with MAD status 0; 1 otherwise, with
 * the reason on stderr.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <rdma/ib_user_mad.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAD_SIZE	256
#define PERF_CLASS	0x04
#define GET		0x01
#define SET		0x02
#define GET_RESP	0x81
#define CLASS_PORT_INFO	0x0001
#define PORT_COUNTERS	0x0012
#define PORT_COUNTERS_EXT 0x001d
#define GSI_QKEY	0x80010000u
/* A PMA attribute starts after the 24-byte MAD header and 40 reserved bytes. */
#define DATA		64

struct umad {
	struct ib_user_mad_hdr hdr;
	uint8_t mad[MAD_SIZE];
};

static int fd, agent;
static uint64_t tid;

static void die(const char *what)
{
	fprintf(stderr, "pma-query: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint16_t be16(const uint8_t *p)
{
	return p[0] << 8 | p[1];
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)be16(p) << 16 | be16(p + 2);
}

static uint64_t be64(const uint8_t *p)
{
	return (uint64_t)be32(p) << 32 | be32(p + 4);
}

/* One request to (lid, QP1) and its answer in 'out'; exits on any failure. */
static void ask(uint16_t lid, uint8_t method, uint16_t attr, uint16_t select,
		uint8_t *out)
{
	struct umad req = { 0 }, resp;
	uint64_t t = htobe64(++tid);
	uint16_t a = htons(attr), sel = htons(select);
	ssize_t n;

	req.hdr.id = agent;
	req.hdr.timeout_ms = 1000;
	req.hdr.retries = 3;
	req.hdr.qpn = htonl(1);
	req.hdr.qkey = htonl(GSI_QKEY);
	req.hdr.lid = htons(lid);
	req.mad[0] = 1;			/* base version */
	req.mad[1] = PERF_CLASS;
	req.mad[2] = 1;			/* class version */
	req.mad[3] = method;
	memcpy(req.mad + 8, &t, 8);
	memcpy(req.mad + 16, &a, 2);
	req.mad[DATA + 1] = 1;		/* PortSelect: port 1 */
	memcpy(req.mad + DATA + 2, &sel, 2);
	if (write(fd, &req, sizeof(req)) != sizeof(req))
		die("write");
	for (;;) {
		n = read(fd, &resp, sizeof(resp));
		if (n < 0)
			die("read");
		if (resp.hdr.status) {
			errno = resp.hdr.status;
			die("no answer");
		}
		/*
		 * ib_umad puts its agent's number in the TID's upper half:
		 * the lower half is ours. (A late answer to an earlier
		 * request is skipped.)
		 */
		if (memcmp(resp.mad + 12, (uint8_t *)&t + 4, 4) == 0)
			break;
	}
	if (resp.mad[3] != GET_RESP || be16(resp.mad + 4) != 0) {
		fprintf(stderr, "pma-query: attribute %#x: method %#x status %#x\n",
			attr, resp.mad[3], be16(resp.mad + 4));
		exit(1);
	}
	memcpy(out, resp.mad, MAD_SIZE);
}

int main(int argc, char **argv)
{
	struct ib_user_mad_reg_req reg = { 0 };
	int reset = argc == 3 && strcmp(argv[1], "-r") == 0;
	uint8_t m[MAD_SIZE], *d = m + DATA;
	uint16_t lid;

	if (argc != 2 + reset) {
		fprintf(stderr, "usage: pma-query [-r] LID\n");
		return 2;
	}
	lid = strtoul(argv[1 + reset], NULL, 0);
	fd = open("/dev/infiniband/umad0", O_RDWR);
	if (fd < 0)
		die("/dev/infiniband/umad0");
	if (ioctl(fd, IB_USER_MAD_ENABLE_PKEY, NULL))
		die("IB_USER_MAD_ENABLE_PKEY");
	reg.qpn = 1;
	reg.mgmt_class = PERF_CLASS;
	reg.mgmt_class_version = 1;
	if (ioctl(fd, IB_USER_MAD_REGISTER_AGENT, &reg))
		die("IB_USER_MAD_REGISTER_AGENT");
	agent = reg.id;
	tid = (uint32_t)(getpid() << 16 ^ time(NULL));

	ask(lid, GET, CLASS_PORT_INFO, 0, m);
	printf("capability_mask %#x\n", be16(d + 2));
	ask(lid, reset ? SET : GET, PORT_COUNTERS, reset ? 0xffff : 0, m);
	printf("link_downed %u\n", d[7]);
	printf("port_rcv_errors %u\n", be16(d + 8));
	printf("port_xmit_discards %u\n", be16(d + 14));
	printf("port_rcv_constraint_errors %u\n", d[17]);
	printf("port_xmit_data %u\n", be32(d + 24));
	printf("port_rcv_data %u\n", be32(d + 28));
	printf("port_xmit_packets %u\n", be32(d + 32));
	printf("port_rcv_packets %u\n", be32(d + 36));
	ask(lid, reset ? SET : GET, PORT_COUNTERS_EXT, reset ? 0xff : 0, m);
	printf("ext_port_xmit_data %llu\n", (unsigned long long)be64(d + 8));
	printf("ext_port_rcv_data %llu\n", (unsigned long long)be64(d + 16));
	printf("ext_port_xmit_packets %llu\n", (unsigned long long)be64(d + 24));
	printf("ext_port_rcv_packets %llu\n", (unsigned long long)be64(d + 32));
	printf("ext_port_unicast_xmit_packets %llu\n",
	       (unsigned long long)be64(d + 40));
	printf("ext_port_unicast_rcv_packets %llu\n",
	       (unsigned long long)be64(d + 48));
	printf("ext_port_multicast_xmit_packets %llu\n",
	       (unsigned long long)be64(d + 56));
	printf("ext_port_multicast_rcv_packets %llu\n",
	       (unsigned long long)be64(d + 64));
	return 0;
}
