/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The coherence protocol: page-based sequential consistency with single
 * writer / multiple readers and write-invalidate, under Li and Hudak's
 * fixed distributed managers (page p is managed by node p % nodes + 1),
 * plus barriers (managed by node 1) and locks (lock l by node
 * l % nodes + 1). The split of the paper's section 4: asynchronous entry
 * points (message handlers) change coherence state and page protections,
 * atomically, in the completion handler; synchronous entry points (faults,
 * barrier, lock calls from the application) do request bookkeeping only
 * and sleep until an asynchronous entry point wakes them.
 */
#ifndef DSM_PROTO_H
#define DSM_PROTO_H

#include <linux/mm_types.h>
#include <linux/types.h>
#include <rdma/ib_verbs.h>

struct dsm_comm;
struct dsm_proto;

/* The first message type of the protocol; lower ones are the self-test's. */
#define DSM_PROTO_TYPE_MIN	16

int dsm_proto_open(struct dsm_comm *c, u32 npages);
/* Closes the protocol and the connections; -EBUSY while an application has the space open, unless force. */
int dsm_close(struct dsm_comm *c, bool force);
int dsm_proto_handle(struct dsm_comm *c, u32 peer, void *msg, u32 len,
		     bool in_irq);
void dsm_proto_peer_lost(struct dsm_comm *c, u32 peer,
			 enum ib_wc_status status);
vm_fault_t dsm_proto_fault(struct dsm_proto *d, u32 page, bool write);
long dsm_proto_ioctl(struct dsm_proto *d, unsigned int cmd, void __user *arg);
/* Where messages are handled: the paper's section 5.1 variants. */
enum dsm_mode {
	DSM_MODE_IRQ,		/* the completion handler (process context when it must) */
	DSM_MODE_TASK_QUEUE,	/* always a kernel workqueue */
	DSM_MODE_USER_SIM,	/* the application, signalled (usim.c) */
};

/*
 * The mode, and read faults by RDMA Read; -EBUSY when user-sim is turned
 * on or off while an application maps the space.
 */
int dsm_proto_config(struct dsm_proto *d, enum dsm_mode mode, bool rdma_read);
int dsm_proto_stats(struct dsm_proto *d, char *out, size_t len);
/* The size of a state report (dsm_proto_state). */
#define DSM_STATE_MAX	2048
/*
 * What this node's side of the protocol waits on and holds (`dsmctl state`);
 * dsm_proto_report() puts it in the kernel log. Process context.
 */
int dsm_proto_state(struct dsm_proto *d, char *out, size_t len);
void dsm_proto_report(struct dsm_proto *d);
/* usim.c: /dev/dsm's O_ASYNC (the user-level simulation's signal). */
int dsm_proto_fasync(struct dsm_proto *d, int fd, struct file *f, int on);
/*
 * proto.c: the simulated user level's process let go of the space: its
 * pending mprotects are moot, so the messages held for them go now.
 */
void dsm_proto_usim_release(struct dsm_proto *d);
/* region.c: a TLB shootdown finished (any context; the last IPI's CPU). */
void dsm_proto_fence_done(struct dsm_proto *d);

#endif /* DSM_PROTO_H */
