/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The protocol's state, shared by its asynchronous (proto.c, message
 * handlers) and synchronous (sync.c, application calls) entry points.
 *
 * Locking: d->lock is the protocol lock. Asynchronous entry points run
 * under it: in the completion handler they only try it (busy: the message
 * goes to process context), in process context they take it with
 * interrupts on, so dsm_protect() may flush other CPUs' TLBs there. It
 * guards the manager state, the queued requests, the self queue, the
 * barrier and lock managers. Fields marked "async writes" are written
 * under it and read by synchronous entry points without it (a benign
 * read-write race, the paper's section 4). d->req_lock (a mutex) guards
 * the synchronous side's request bookkeeping.
 */
#ifndef DSM_PROTO_INT_H
#define DSM_PROTO_INT_H

#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include "dsm.h"
#include "uapi.h"

enum dsm_type {
	DSM_REQ_READ = DSM_PROTO_TYPE_MIN,	/* to the manager: addr = our frame */
	DSM_REQ_WRITE,
	DSM_FWD_READ,		/* to the owner: send node the page at addr */
	DSM_FWD_WRITE,		/* same, and drop ours; DSM_F_DATA: with the data */
	DSM_INV,		/* to a copy holder: drop it, ack to the manager */
	DSM_INV_ACK,
	DSM_DATA_READ,		/* to the requester: the page is in its frame */
	DSM_DATA_WRITE,
	DSM_FETCH,		/* to the requester: RDMA Read it from node at addr */
	DSM_FETCH_DONE,		/* our own RDMA Read completed */
	DSM_CONFIRM_READ,	/* to the manager: transaction done */
	DSM_CONFIRM_WRITE,	/* addr = the new owner's frame */
	DSM_BAR_ENTER,		/* arg = barrier generation */
	DSM_BAR_GO,
	DSM_LOCK_REQ,		/* arg = lock id */
	DSM_LOCK_GRANT,
	DSM_UNLOCK,
	DSM_PROBE,		/* a wait of ours runs long: are you there? (no answer) */
	DSM_TYPE_END
};

#define DSM_F_DATA	1

struct dsm_pmsg {
	struct dsm_msg_hdr h;
	__le32 arg;		/* page, lock id or barrier generation */
	__le16 node;		/* the node a forward serves; FETCH: the owner */
	__le16 flags;
	__le64 addr;		/* a frame's DMA address */
};

/* A page's state at its manager. */
struct dsm_mgr_page {
	u64 owner_addr;		/* the owner's frame, for RDMA Read */
	u64 req_addr;		/* the open transaction's requester frame */
	u16 copyset;		/* read copies besides the owner's: BIT(node - 1) */
	u8 owner;
	u8 owner_ro;		/* the owner's own access is read-only */
	u8 busy;		/* a transaction is open */
	u8 req_from;		/* the open transaction's requester */
	u8 acks_left;		/* invalidations not yet acknowledged */
};

/* A request that found its page busy, at the page's manager. */
struct dsm_waiter {
	struct list_head link;
	u64 addr;
	u32 page;
	u8 from, kind;
};

#define DSM_WAITERS	256

struct dsm_lockmgr {
	u8 holder;		/* 0: free */
	u8 qh, qn;
	u8 q[DSM_MAX_NODES];
};

/* A message to ourselves, handled after the current one. */
struct dsm_selfmsg {
	struct list_head link;
	struct dsm_pmsg m;
};

/*
 * A message held back while a TLB shootdown is in flight: its send
 * buffer is reserved and written, only the post waits.
 */
struct dsm_held {
	u32 to, slot, type;
	u64 src, dst;
};

/* Protection changes the user-level simulation hands its process per SERVE. */
#define DSM_USIM_OPS	512

/* Every held message holds a send buffer, so this many never overflow. */
#define DSM_HELD	(DSM_MAX_NODES * DSM_SENDS)

struct dsm_pstats {
	atomic64_t read_faults, write_faults, read_fault_ns, write_fault_ns;
	atomic64_t invalidations, handled_irq, handled_process;
	atomic64_t barriers, lock_acquires, protocol_errors;
	atomic64_t fenced, held;
	atomic64_t kept;	/* grants of contended pages kept from a taker */
	atomic64_t probes;	/* probes sent (dsm_proto_probe) */
	atomic64_t stale;	/* read requests from the page's owner (mgr_start_read) */
	atomic64_t moot;	/* fault requests not sent: granted since (dsm_proto_request) */
};

/*
 * The protocol's recent messages, handled, refused for now and sent, under
 * d->lock: when a wait runs out, the report prints the history of the pages
 * it names, which a state snapshot alone cannot show (how a manager's
 * record went stale, say).
 */
#define DSM_TRACE	1024

/*
 * FAULT: a fault's check (type: the request it needs, node: 1 if it sends
 * it, 0 if it waits for another thread's); DONE: that request's wait ended
 * (node: 1 if it failed). For both, peer is the thread (its PID's low bits).
 */
enum dsm_trace_dir { DSM_TR_IN, DSM_TR_AGAIN, DSM_TR_OUT, DSM_TR_FAULT, DSM_TR_DONE };

struct dsm_trace_ent {
	u64 ns;			/* ktime */
	u32 arg;
	u16 type;
	u8 peer;		/* the sender (in) or the destination (out) */
	u8 dir;			/* enum dsm_trace_dir */
	u8 node;		/* the message's node field */
	s8 prot;		/* the page's protection after it (in) */
};

/* Per page: whether a grant to us is kept from other nodes (proto.c, page_held). */
struct dsm_hold {
	u64 until;		/* ktime (ns): kept until then, while contended */
	u64 contended_until;	/* a grant was taken before use: hold until then */
	bool unused;		/* granted, its faulting thread not yet run again */
	bool counted;		/* this grant is counted in kept */
};

struct dsm_proto {
	struct dsm_comm *c;
	struct ib_device *dev;
	struct dsm_region *r;
	bool dead;			/* device or a peer gone under the app */
	u32 npages, self, nodes;
	u64 *dma;			/* our frames' DMA addresses */
	spinlock_t lock;
	struct dsm_mgr_page *mgr;	/* indexed by page; used for ours */
	struct list_head waiting, free_waiters;
	struct dsm_waiter waiters[DSM_WAITERS];
	struct list_head selfq;
	struct work_struct self_work;	/* self queue or waiters stuck: retry */
	u32 bar_count[2];
	struct dsm_lockmgr locks[DSM_LOCKS];
	struct dsm_trace_ent *trace;	/* DSM_TRACE of them, apart: 16 KiB */
	u32 trace_n;			/* entries ever written */
	bool process_only, rdma_read;
	/*
	 * Messages held while the region is fenced, in post order (so one
	 * peer's messages keep theirs). fence_lock (irqsave) guards them;
	 * it is taken inside d->lock and by the last IPI of a shootdown.
	 */
	spinlock_t fence_lock;
	struct dsm_held *heldq;
	u32 held_head, held_n;
	/*
	 * User-level simulation (usim.c): messages queue for the process's
	 * SERVE calls (usim_lock, irqsave); protection changes are recorded
	 * in usim_ops (under d->lock) for the process to mprotect, and
	 * messages are held back until it has.
	 */
	bool usim;
	spinlock_t usim_lock;
	struct list_head usim_q;
	struct fasync_struct *fasync;
	struct mutex usim_serve;	/* one SERVE at a time */
	struct dsm_prot_op *usim_ops;
	u32 usim_nops;
	/*
	 * Changes recorded, handed to the process, and known applied (counts,
	 * under d->lock; recorded and applied change under fence_lock too, and
	 * are read without locks): messages are held while recorded !=
	 * applied; a fault waits for the count recorded at its grant, not for
	 * a quiet moment, which never comes under steady traffic.
	 */
	u64 usim_recorded, usim_handed, usim_applied;
	struct task_struct *usim_server;	/* in SERVE now, if any */
	/* async writes */
	u32 *grants;			/* per page: grants received */
	struct dsm_hold *hold;		/* per page: see page_held() */
	u32 bar_done;			/* last barrier generation released */
	u32 lock_grants[DSM_LOCKS];
	wait_queue_head_t wq;
	/* the synchronous side */
	struct mutex req_lock;
	u8 *inflight;			/* per page: our request's kind, 0: none */
	u32 bar_gen;
	unsigned long held[BITS_TO_LONGS(DSM_LOCKS)];	/* locks this node holds or wants */
	struct dsm_pstats st;
};

static inline u32 dsm_manager(struct dsm_proto *d, u32 page)
{
	return page % d->nodes + 1;
}

/* proto.c: queue a request to node `to` from process context (sleeps while resources are short). */
int dsm_proto_request(struct dsm_proto *d, u32 to, u32 type, u32 arg, u64 addr);
/* proto.c: a fault's step in the trace (enum dsm_trace_dir's FAULT and DONE). */
void dsm_proto_trace_fault(struct dsm_proto *d, u32 dir, u32 page, bool write,
			   bool flag);
/* A wait runs long: a message to every peer, so that a lost one shows. */
void dsm_proto_probe(struct dsm_proto *d);
/* sync.c: a DSM fault's request and wait; 0 once the access is allowed. */
int dsm_proto_fault_wait(struct dsm_proto *d, u32 page, bool write);
/* proto.c: the thread that faulted on the page runs again; a hold of the page ends. */
void dsm_proto_page_used(struct dsm_proto *d, u32 page);
/* proto.c: handles one message in process context now; -EAGAIN: try again later. */
int dsm_proto_handle_now(struct dsm_proto *d, u32 peer, const struct dsm_pmsg *m);
/* proto.c: the process applied every recorded protection (if none is new): release held messages. */
void dsm_proto_usim_applied(struct dsm_proto *d);

/* usim.c */
int dsm_usim_queue(struct dsm_proto *d, u32 peer, const void *msg);
void dsm_usim_kick(struct dsm_proto *d);
long dsm_usim_ioctl(struct dsm_proto *d, unsigned int cmd, void __user *arg);
void dsm_usim_free(struct dsm_proto *d);

#endif /* DSM_PROTO_INT_H */
