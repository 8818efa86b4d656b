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
	__u32 user_sim;	/* the session simulates a user-level DSM (below) */
	__u32 rsvd;
};

/*
 * User-level simulation (dsmctl config handler=user-sim), the paper's
 * section 5.1: the kernel handles no message by itself. It queues each
 * and signals the process (SIGIO, via O_ASYNC), whose service thread
 * calls DSM_IOC_SERVE; protections change by the process's own mprotect
 * calls, so an access to a protected page is a SIGSEGV that the process
 * turns into DSM_IOC_FAULT.
 */
struct dsm_prot_op {
	__u32 page;
	__u32 prot;	/* DSM_PROT_*: mprotect the page so */
};

struct dsm_serve {
	__u64 ops;	/* user pointer to max struct dsm_prot_op */
	__u32 max;
	__u32 n;	/* out: ops to apply before the next SERVE */
	__u32 handled;	/* out: messages handled */
	__u32 left;	/* out: messages still queued */
};

struct dsm_fault_req {
	__u32 page;
	__u32 write;
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
/* Handles queued messages; the ops of the previous call have been applied. */
#define DSM_IOC_SERVE	_IOWR('D', 7, struct dsm_serve)
/* A SIGSEGV on a DSM page: returns once the access is allowed and mprotected. */
#define DSM_IOC_FAULT	_IOW('D', 8, struct dsm_fault_req)
/* Copies every page's DSM_PROT_* (one byte each) to the user pointer. */
#define DSM_IOC_PROTMAP	_IOW('D', 9, __u64)

#endif /* DSM_UAPI_H */
