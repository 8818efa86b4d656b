// SPDX-License-Identifier: GPL-2.0
/*
 * A self-test of the communication layer until the coherence protocol
 * lands: this node PINGs every peer `msgs` times; each peer's handler
 * answers with a PONG echoing the payload, in interrupt context, or in
 * process context when the handler defers (forced for every
 * n-th message after `defer n`, and whenever no send buffer is free). The
 * initiator checks every PONG's bytes.
 */
#include <linux/delay.h>
#include <linux/ktime.h>
#include "hcab_compat.h"
#include "dsm.h"

enum { DSM_MSG_PING = 1, DSM_MSG_PONG = 2 };

/*
 * PINGs in flight per peer. The layer has no flow control: what keeps a
 * peer's receives from running out is this bound (a peer may have this
 * many PINGs and as many PONGs in flight to us, well under DSM_RECVS),
 * as the DSM protocol's bound on outstanding requests will.
 */
#define DSM_WINDOW	16

static struct {
	u32 expected;
	atomic_t pongs, errors;
	atomic_t acked[DSM_MAX_NODES + 1];
	u32 defer_every;
	struct completion done;
} st;

static u8 dsm_pat(u32 i, u32 seq, u32 node)
{
	return (u8)(i * 7 + seq + node);
}

/* Fills a message: header, then pat() bytes. */
static void dsm_fill(u8 *buf, u32 len, u16 type, u32 from, u32 seq, u32 node)
{
	struct dsm_msg_hdr *h = (struct dsm_msg_hdr *)buf;
	u32 i;

	h->type = cpu_to_le16(type);
	h->from = cpu_to_le16(from);
	h->seq = cpu_to_le32(seq);
	for (i = sizeof(*h); i < len; i++)
		buf[i] = dsm_pat(i, seq, node);
}

static bool dsm_payload_ok(const u8 *buf, u32 len, u32 seq, u32 node)
{
	u32 i;

	for (i = sizeof(struct dsm_msg_hdr); i < len; i++)
		if (buf[i] != dsm_pat(i, seq, node))
			return false;
	return true;
}

/* Answers a PING; -EAGAIN when it must wait for a buffer (not in interrupt context). */
static int dsm_answer(struct dsm_comm *c, u32 peer, const u8 *msg, u32 len,
		      bool in_irq)
{
	const struct dsm_msg_hdr *h = (const void *)msg;
	u32 slot;
	u8 *out;

	for (;;) {
		out = dsm_msg_reserve(c, peer, &slot);
		if (out)
			break;
		if (in_irq)
			return -EAGAIN;
		usleep_range(50, 100);
	}
	memcpy(out, msg, len);
	dsm_fill(out, sizeof(*h), DSM_MSG_PONG, c->self, le32_to_cpu(h->seq), 0);
	if (dsm_msg_send(c, peer, slot, len, false)) {
		dsm_msg_unreserve(c, peer, slot);
		atomic_inc(&st.errors);
	}
	return 0;
}

int dsm_selftest_handle(struct dsm_comm *c, u32 peer, void *msg, u32 len,
			bool in_irq)
{
	const struct dsm_msg_hdr *h = msg;
	u32 seq;

	if (len < sizeof(*h) || le16_to_cpu(h->from) != peer) {
		atomic_inc(&st.errors);
		return 0;
	}
	seq = le32_to_cpu(h->seq);
	switch (le16_to_cpu(h->type)) {
	case DSM_MSG_PING:
		if (in_irq && READ_ONCE(st.defer_every) &&
		    seq % READ_ONCE(st.defer_every) == 0)
			return -EAGAIN;
		return dsm_answer(c, peer, msg, len, in_irq);
	case DSM_MSG_PONG:
		/* The payload was made by us (node self) for this seq. */
		if (!dsm_payload_ok(msg, len, seq, c->self))
			atomic_inc(&st.errors);
		atomic_inc(&st.acked[peer]);
		if (atomic_inc_return(&st.pongs) == READ_ONCE(st.expected))
			complete(&st.done);
		return 0;
	default:
		atomic_inc(&st.errors);
		return 0;
	}
}

static int dsm_ping(struct dsm_comm *c, u32 peer, u32 seq, u32 size)
{
	unsigned long deadline = jiffies + 10 * HZ;
	u32 slot;
	u8 *buf;
	int err;

	/* seq PINGs went to this peer before this one. */
	while (seq - atomic_read(&st.acked[peer]) >= DSM_WINDOW) {
		if (time_after(jiffies, deadline))
			return -ETIMEDOUT;
		usleep_range(20, 50);
	}
	while (!(buf = dsm_msg_reserve(c, peer, &slot))) {
		if (time_after(jiffies, deadline))
			return -EBUSY;
		usleep_range(50, 100);
	}
	dsm_fill(buf, size, DSM_MSG_PING, c->self, seq, c->self);
	err = dsm_msg_send(c, peer, slot, size, false);
	if (err)
		dsm_msg_unreserve(c, peer, slot);
	return err;
}

/* This node's handler defers every n-th PING to process context (0: never). */
void dsm_selftest_defer(u32 n)
{
	WRITE_ONCE(st.defer_every, n);
}

int dsm_selftest(struct dsm_comm *c, u32 msgs, u32 size, char *out, size_t len)
{
	u64 deferred0 = atomic64_read(&c->stats.deferred);
	ktime_t t0 = ktime_get();
	u32 m, peer;
	int err = 0;

	if (!c->dev || !msgs || size < sizeof(struct dsm_msg_hdr) ||
	    size > DSM_MSG_MAX)
		return -EINVAL;
	for (peer = 1; peer <= c->nodes; peer++)
		if (peer != c->self && !c->peers[peer].connected)
			return -ENOTCONN;
	atomic_set(&st.pongs, 0);
	atomic_set(&st.errors, 0);
	for (peer = 0; peer <= DSM_MAX_NODES; peer++)
		atomic_set(&st.acked[peer], 0);
	WRITE_ONCE(st.expected, msgs * (c->nodes - 1));
	init_completion(&st.done);
	for (m = 0; m < msgs && !err; m++)
		for (peer = 1; peer <= c->nodes && !err; peer++)
			if (peer != c->self)
				err = dsm_ping(c, peer, m, size);
	if (!err && !wait_for_completion_timeout(&st.done, 60 * HZ))
		err = -ETIMEDOUT;
	return scnprintf(out, len,
			 "selftest node=%u msgs=%u size=%u pongs=%u errors=%d err=%d deferred=%llu us=%lld\n",
			 c->self, msgs * (c->nodes - 1), size,
			 atomic_read(&st.pongs), atomic_read(&st.errors), err,
			 atomic64_read(&c->stats.deferred) - deferred0,
			 ktime_us_delta(ktime_get(), t0));
}
