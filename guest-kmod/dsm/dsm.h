/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dsm: the kernel DSM's communication layer, the paper's section 3
 * primitives over plain verbs. One RC QP to every other node, one CQ and
 * one completion handler for all of them; control messages by Send with
 * buffers the layer reserves, posts unsignaled (signaled now and then for
 * cleanup, or when the sender asks to be told) and reclaims on completion;
 * enough receives pre-posted per QP for the bounded number of in-flight
 * messages, so no flow control; a receive buffer is lent to the protocol
 * only during its handler call. The handler runs in the CQ's completion
 * handler (interrupt context); when it reports a resource shortage
 * (-EAGAIN) the message is copied and handled again in process context.
 * Page data moves by RDMA Write chained before the Send that announces it
 * (one RC QP orders them), or by an RDMA Read the reader posts; both use
 * the peers' global rkeys (IB_PD_UNSAFE_GLOBAL_RKEY) and DMA addresses the
 * protocol hands around.
 *
 * Locking: peer->lock (irqsave) guards a peer's send buffers. The CQ is
 * consumed only by the completion handler, which ib_core never runs
 * concurrently with itself for one CQ; dsm_ctl.lock (a mutex, ctl.c) guards
 * set-up and tear-down, which happen with the CQ quiet.
 */
#ifndef DSM_H
#define DSM_H

#include <linux/types.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include "proto.h"

#define DSM_MAX_NODES		16
#define DSM_RECVS		64	/* per peer: bound on its in-flight messages */
#define DSM_SENDS		64	/* per peer: send buffers */
#define DSM_MSG_MAX		256
#define DSM_SIGNAL_EVERY	16
/* Send-queue depth: a message may carry an RDMA Write, plus a few RDMA Reads. */
#define DSM_SQ			(2 * DSM_SENDS + 8)
#define DSM_NO_SLOT		U32_MAX

/* Every control message starts with this. */
struct dsm_msg_hdr {
	__le16 type;
	__le16 from;
	__le32 seq;
};

struct dsm_peer {
	u32 id;
	struct ib_qp *qp;
	bool connected;
	u32 rkey;		/* its global rkey, for page data */
	u8 *rbuf;		/* DSM_RECVS x DSM_MSG_MAX */
	u64 rbuf_dma;
	u8 *sbuf;		/* DSM_SENDS x DSM_MSG_MAX */
	u64 sbuf_dma;
	spinlock_t lock;	/* guards everything below */
	u32 free[DSM_SENDS];	/* stack of free send slots */
	u32 nfree;
	u32 fifo[DSM_SQ];	/* posted WRs' slots (or DSM_NO_SLOT), in post order */
	u32 fifo_head, fifo_tail;
	u64 post_seq;		/* WRs posted so far */
	u64 fifo_seq[DSM_SQ];
	/*
	 * Messages posted to the peer and received from it: with the peer's
	 * own pair, a state report tells a message never taken from the
	 * send queue from one lost on the receiving side.
	 */
	u64 msgs_out, msgs_in;
};

/* A message the handler could not take in interrupt context. */
struct dsm_deferred {
	struct list_head link;
	u32 peer;
	u32 len;
	u8 data[];
};

#define DSM_READS	8	/* RDMA Reads in flight */
#define DSM_DONE_MAX	64

/* An RDMA Read in flight and the message its completion hands the handler. */
struct dsm_read {
	u32 peer;		/* 0: free */
	u32 len;
	u8 done[DSM_DONE_MAX];
};

struct dsm_stats {
	atomic64_t sent, received, deferred, send_busy, cqe_errors;
	atomic64_t msg_bytes, data_bytes, rdma_reads;
};

struct dsm_comm {
	struct ib_device *dev;
	struct ib_pd *pd;
	struct ib_cq *cq;
	u32 self, nodes;	/* node ids are 1..nodes */
	u32 lid, psn, rkey;
	bool roce;
	int sgid_index;
	union ib_gid sgid;
	enum ib_mtu mtu;
	struct dsm_peer peers[DSM_MAX_NODES + 1];
	/*
	 * The protocol's entry point for a message: called in interrupt
	 * context first; -EAGAIN asks for a second call in process context
	 * (and again, after a short sleep, while it says -EAGAIN there).
	 * Messages are handled in arrival order: while one waits for process
	 * context, later ones queue behind it.
	 */
	int (*handle)(struct dsm_comm *c, u32 peer, void *msg, u32 len,
		      bool in_irq);
	/*
	 * A WR to `peer` ended in error (not a flush): its retries ran out, so
	 * the peer is gone or unreachable. Called in interrupt context.
	 */
	void (*peer_lost)(struct dsm_comm *c, u32 peer,
			  enum ib_wc_status status);
	spinlock_t read_lock;	/* guards claiming reads[] */
	struct dsm_read reads[DSM_READS];
	spinlock_t defer_lock;	/* guards deferred */
	struct list_head deferred;
	struct work_struct defer_work;
	/*
	 * The CQ polled in process context: set once the provider called the
	 * handler where it may not poll (common/cqpoll.h), and kept, so that
	 * the CQ is never polled from two contexts at once.
	 */
	bool poll_in_task;
	struct work_struct poll_work;
	struct dsm_stats stats;
	struct dsm_proto *proto;	/* the coherence protocol, when a space is open */
};

/* comm.c */
int dsm_comm_open(struct dsm_comm *c, struct ib_device *dev, u32 self, u32 nodes);
void dsm_comm_close(struct dsm_comm *c);
int dsm_comm_addr(struct dsm_comm *c, char *out, size_t len);
/* Deferred messages, reads in flight, per peer QP state and buffers; may sleep. */
int dsm_comm_state(struct dsm_comm *c, char *out, size_t len);
int dsm_comm_connect(struct dsm_comm *c, u32 peer, u32 lid, u32 qpn, u32 psn,
		     u32 rkey, const union ib_gid *gid);
void *dsm_msg_reserve(struct dsm_comm *c, u32 peer, u32 *slot);
int dsm_msg_send(struct dsm_comm *c, u32 peer, u32 slot, u32 len, bool notify);
void dsm_msg_unreserve(struct dsm_comm *c, u32 peer, u32 slot);
/* Like dsm_msg_send, preceded by an RDMA Write of dlen bytes at src to the peer's dst. */
int dsm_msg_send_data(struct dsm_comm *c, u32 peer, u32 slot, u32 len,
		      u64 src, u64 dst, u32 dlen);
/*
 * RDMA Read of len bytes at the peer's src into dst; on completion the
 * handler gets `done` (len dlen) as a message from ourselves.
 */
int dsm_rdma_read(struct dsm_comm *c, u32 peer, u64 dst, u64 src, u32 len,
		  const void *done, u32 dlen);
/* From the CQ handler: a message to the handler, or to process context behind earlier ones. */
void dsm_deliver(struct dsm_comm *c, u32 peer, void *msg, u32 len);

/* The message dispatcher (ctl.c): the self-test's or the protocol's. */
int dsm_dispatch(struct dsm_comm *c, u32 peer, void *msg, u32 len, bool in_irq);

/* selftest.c */
int dsm_selftest(struct dsm_comm *c, u32 msgs, u32 size, char *out, size_t len);
void dsm_selftest_defer(u32 n);
int dsm_selftest_handle(struct dsm_comm *c, u32 peer, void *msg, u32 len,
			bool in_irq);

#endif /* DSM_H */
