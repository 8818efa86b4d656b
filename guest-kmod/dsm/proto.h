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
/*
 * Knobs for the benchmarks: handle every message in process context; read
 * faults by RDMA Read.
 */
void dsm_proto_config(struct dsm_proto *d, bool process_only, bool rdma_read);
int dsm_proto_stats(struct dsm_proto *d, char *out, size_t len);

#endif /* DSM_PROTO_H */
