/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vbench: a plain kernel verbs consumer that measures RC ping-pong round
 * trips with the receiver handling completions by polling, in the
 * completion handler (interrupt context), in a workqueue, or in a user
 * process the handler wakes (the paper's Table 1), plus RDMA Write and
 * Read bandwidth. Only standard verbs: it runs unchanged over any RC
 * capable ib_device (our HCA, rdma_rxe). The harness hands each side the
 * other's address ("addresses handed in by the harness").
 *
 * Locking: the control device's mutex (vb_ctl.lock, main.c) serialises
 * control commands. While a run is active, the CQ is consumed by exactly
 * one context chosen by the mode; mode changes happen only under that
 * lock with the CQ quiet (no run).
 */
#ifndef VBENCH_H
#define VBENCH_H

#include <linux/types.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/kthread.h>
#include <rdma/ib_verbs.h>
#include "rcconn.h"
#include "cqpoll.h"

#define VB_MAX_MSG	4096
#define VB_RECVS	64
#define VB_SQ_DEPTH	128
#define VB_SIGNAL_EVERY	16
#define VB_REGION	(1 << 20)	/* each of: read region, write region */
#define VB_PONG		0x80000000u
#define VB_MAX_ITERS	100000

enum vb_mode { VB_IDLE, VB_POLL, VB_ISR, VB_WQ, VB_USER };
enum vb_role { VB_NONE, VB_SERVER, VB_CLIENT };

struct vb_peer {
	u32 lid, qpn, psn, rkey;
	u64 raddr;
	union ib_gid gid;
};

struct vb_ctx {
	struct ib_device *dev;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	u32 psn;
	u32 lid;	/* ours */
	int sgid_index;
	union ib_gid sgid;
	bool roce;
	enum ib_mtu mtu;
	struct vb_peer peer;

	/* Receive buffers (VB_RECVS x VB_MAX_MSG) and the send buffer. */
	u8 *rbuf, *sbuf;
	u64 rbuf_dma, sbuf_dma;
	/* Exposed to the peer: read region then write region. */
	u8 *region;
	u64 region_dma;
	/* Local source/sink for RDMA. */
	u8 *local;
	u64 local_dma;
	u32 sends;	/* for one-in-VB_SIGNAL_EVERY signaling */

	enum vb_role role;
	enum vb_mode mode;
	bool verify;
	u32 size;
	u32 iters, done;
	u32 seq;	/* next ping (client) */
	u32 warmup;	/* round trips not counted */
	u32 last_size;	/* server: size the send buffer is set up for */
	u32 errors;
	/* isr mode: handler calls handed to the workqueue (common/cqpoll.h) */
	u32 deferred;
	ktime_t t0;
	u64 sum_ns, min_ns, max_ns;
	u32 *samples;	/* counted round trips, ns, for the median */
	u32 nsamples;
	struct completion finished;
	struct work_struct work;
	struct workqueue_struct *wq;
	struct task_struct *poller;

	/* User mode: the handler bumps events and wakes the reader. */
	wait_queue_head_t waitq;
	atomic_t events;
	int user_seen;
};

extern struct vb_ctx *vb;
extern const u8 *vb_pattern;

/* conn.c */
int vb_open(struct ib_device *dev);
int vb_open_on(struct ib_device *dev, bool own_qp);
void vb_qp_init_attr(struct ib_qp_init_attr *init);
int vb_post_recvs(void);
void vb_close(void);
int vb_connect(const struct vb_peer *peer);
int vb_addr(char *out, size_t len);
struct rcconn_path vb_rc_path(u32 dlid, const union ib_gid *dgid);
int vb_poll_one(struct ib_cq *cq, struct ib_wc *wc, unsigned long timeout);
int vb_post_recv(u32 slot);
int vb_post_send(u32 size, u32 word0, bool force_signal);

/* pingpong.c */
void vb_fill(u8 *buf, u32 size, u32 word0);
bool vb_check(const u8 *buf, u32 size, u32 word0, bool full);
void vb_drain_cq(void);
void vb_comp_handler(struct ib_cq *cq, void *ctx);
int vb_serve(enum vb_mode mode);
void vb_stop(void);
int vb_ping(enum vb_mode mode, u32 size, u32 iters, char *out, size_t len);
ssize_t vb_user_read(char __user *buf, size_t len);
ssize_t vb_user_write(const char __user *buf, size_t len);
void vb_work_fn(struct work_struct *w);

/* bw.c */
int vb_bw(bool read, u32 size, u32 iters, char *out, size_t len);
int vb_badrkey(char *out, size_t len);
int vb_fastreg(char *out, size_t len);

/* ud.c */
int vb_udloop(char *out, size_t len);
/* atomic.c */
int vb_atomic(char *out, size_t len);
/* cqclean.c */
int vb_cqclean(char *out, size_t len);

/* mad.c */
int vb_mad(char *out, size_t len);

/* cm.c */
void vb_cm_init(struct mutex *ctl_lock);
int vb_cm_listen(u16 port);
int vb_cm_connect(const char *addr, u16 port);
int vb_cm_wait(char *out, size_t len);
void vb_cm_close_listener(void);
bool vb_cm_close_connection(void);

#endif /* VBENCH_H */
