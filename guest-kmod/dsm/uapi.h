/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The DSM's user API: /dev/dsm. mmap of the whole shared space (when a
 * DSM session is open; otherwise a private scratch region for the
 * protection primitive's checks and benchmark) and these ioctls. Shared
 * by the module and the static user library (libdsm).
 */
#ifndef DSM_UAPI_H
#define DSM_UAPI_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define DSM_PROT_NONE	0
#define DSM_PROT_READ	1
#define DSM_PROT_RW	2

#define DSM_LOCKS	64

/* Change the protection of pages[0..n) (page indices in a scratch region). */
struct dsm_protect_req {
	__u64 pages;	/* user pointer to __u32 page indices */
	__u32 n;
	__u32 prot;	/* DSM_PROT_* */
	__u32 atomic;	/* run the primitive with interrupts off (as a handler would) */
	__u32 rsvd;
};

struct dsm_info {
	__u32 self;	/* this node, 1..nodes */
	__u32 nodes;
	__u32 pages;	/* size of the shared space in pages */
	__u32 page_size;
};

/* This node's protocol counters since the session opened. */
struct dsm_stats_user {
	__u64 read_faults, write_faults;
	__u64 read_fault_ns, write_fault_ns;	/* summed waits */
	__u64 msgs_sent, msgs_received, msg_bytes;
	__u64 data_bytes;		/* page data moved by RDMA (either way, by us) */
	__u64 invalidations;		/* copies we dropped on request */
	__u64 handled_irq, handled_process;
	__u64 barriers, lock_acquires;
	__u64 rdma_reads;
};

#define DSM_IOC_PROTECT	_IOW('D', 1, struct dsm_protect_req)
#define DSM_IOC_INFO	_IOR('D', 2, struct dsm_info)
#define DSM_IOC_BARRIER	_IO('D', 3)
#define DSM_IOC_LOCK	_IOW('D', 4, __u32)
#define DSM_IOC_UNLOCK	_IOW('D', 5, __u32)
#define DSM_IOC_STATS	_IOR('D', 6, struct dsm_stats_user)

#endif /* DSM_UAPI_H */
