// SPDX-License-Identifier: GPL-2.0
/*
 * The protocol's synchronous entry points, in the application's process
 * context: DSM page faults, barriers and locks. They do request
 * bookkeeping only: send a request, sleep until an asynchronous entry
 * point (proto.c) bumps the counter they wait on. Coherence state and
 * protections are read here, never written.
 */
#include <linux/sched/signal.h>
#include <linux/uaccess.h>
#include <linux/ktime.h>
#include "proto.h"
#include "proto_int.h"
#include "region.h"

/* Long enough for a slow emulated cluster; a lost message shows as an error. */
#define DSM_WAIT	(60 * HZ)
/* Each this long of a wait, the peers are probed (dsm_proto_probe). */
#define DSM_PROBE_EVERY	(2 * HZ)

/* Sleeps until done(), the protocol is dead, a signal kills us or DSM_WAIT passes. */
static int dsm_wait(struct dsm_proto *d, const char *what, u32 arg,
		    bool (*done)(struct dsm_proto *d, u32 arg, u32 g), u32 g)
{
	long waited = 0, left;

	for (;;) {
		left = wait_event_killable_timeout(d->wq, done(d, arg, g) ||
						   READ_ONCE(d->dead),
						   min_t(long, DSM_PROBE_EVERY,
							 DSM_WAIT - waited));
		waited += DSM_PROBE_EVERY;
		if (left || waited >= DSM_WAIT)
			break;
		dsm_proto_probe(d);
	}
	if (READ_ONCE(d->dead))
		return -ENODEV;
	if (left > 0)
		return 0;
	if (!left) {
		pr_err("dsm: node %u: %s %u: no answer in %d s\n", d->self, what,
		       arg, DSM_WAIT / HZ);
		dsm_proto_report(d);
	}
	return left ? (int)left : -ETIMEDOUT;
}

static bool page_granted(struct dsm_proto *d, u32 page, u32 g)
{
	return READ_ONCE(d->grants[page]) != g;
}

/* Another thread's request for the page is answered (or gone). */
static bool page_settled(struct dsm_proto *d, u32 page, u32 g)
{
	return READ_ONCE(d->grants[page]) != g || !READ_ONCE(d->inflight[page]);
}

/*
 * A DSM fault: ask the page's manager for a copy (read) or ownership
 * (write) and sleep until the data is in our frame with the protection
 * set; the access is then retried and faults again if the page was taken
 * away meanwhile. One request per page at a time: other threads faulting
 * on it wait for that one. 0, or why it failed.
 */
int dsm_proto_fault_wait(struct dsm_proto *d, u32 page, bool write)
{
	int need = write ? DSM_PROT_RW : DSM_PROT_READ;
	ktime_t t0 = ktime_get();
	bool mine = false;
	u32 g;
	int err;

	if (READ_ONCE(d->dead))
		return -ENODEV;
	mutex_lock(&d->req_lock);
	/*
	 * The grant count first, then the protection. The check may sleep
	 * (req_lock is a mutex) while another thread's request is granted and
	 * that thread lets go of the request slot: this one then finds the
	 * page not granted and the slot free. Its request is not sent
	 * (dsm_proto_request looks again under the protocol lock), and as the
	 * count was read first, the grant shows as a new count and the wait
	 * ends at once.
	 */
	g = READ_ONCE(d->grants[page]);
	smp_rmb();
	if (dsm_region_prot(d->r, page) >= need) {
		mutex_unlock(&d->req_lock);
		return 0;
	}
	if (!d->inflight[page]) {
		d->inflight[page] = need;
		mine = true;
	}
	dsm_proto_trace_fault(d, DSM_TR_FAULT, page, write, mine);
	mutex_unlock(&d->req_lock);
	if (!mine)
		return dsm_wait(d, "page (shared wait)", page, page_settled, g);
	err = dsm_proto_request(d, dsm_manager(d, page),
				write ? DSM_REQ_WRITE : DSM_REQ_READ, page,
				d->dma[page]);
	if (!err)
		err = dsm_wait(d, write ? "write fault" : "read fault", page,
			       page_granted, g);
	dsm_proto_trace_fault(d, DSM_TR_DONE, page, write, err);
	WRITE_ONCE(d->inflight[page], 0);
	wake_up_all(&d->wq);
	if (err)
		return err;
	/* We run again, and retry the access next: the page need not be kept. */
	dsm_proto_page_used(d, page);
	atomic64_inc(write ? &d->st.write_faults : &d->st.read_faults);
	atomic64_add(ktime_to_ns(ktime_sub(ktime_get(), t0)),
		     write ? &d->st.write_fault_ns : &d->st.read_fault_ns);
	return 0;
}

/* The page-fault handler's entry: the access is retried (VM_FAULT_NOPAGE). */
vm_fault_t dsm_proto_fault(struct dsm_proto *d, u32 page, bool write)
{
	return dsm_proto_fault_wait(d, page, write) ? VM_FAULT_SIGBUS :
						      VM_FAULT_NOPAGE;
}

static bool barrier_passed(struct dsm_proto *d, u32 unused, u32 gen)
{
	return (s32)(READ_ONCE(d->bar_done) - gen) >= 0;
}

/* All nodes' processes call it once per phase; node 1 counts and releases. */
static int dsm_barrier(struct dsm_proto *d)
{
	u32 gen;
	int err;

	mutex_lock(&d->req_lock);
	gen = ++d->bar_gen;
	mutex_unlock(&d->req_lock);
	err = dsm_proto_request(d, 1, DSM_BAR_ENTER, gen, 0);
	if (!err)
		err = dsm_wait(d, "barrier", gen, barrier_passed, gen);
	if (!err)
		atomic64_inc(&d->st.barriers);
	return err;
}

static bool lock_granted(struct dsm_proto *d, u32 id, u32 g)
{
	return READ_ONCE(d->lock_grants[id]) != g;
}

static bool lock_local_free(struct dsm_proto *d, u32 id, u32 unused)
{
	return !test_and_set_bit(id, d->held);
}

/* One thread per node competes at the lock's manager: the others queue here. */
static int dsm_lock(struct dsm_proto *d, u32 id)
{
	u32 g;
	int err;

	if (id >= DSM_LOCKS)
		return -EINVAL;
	err = wait_event_killable(d->wq, lock_local_free(d, id, 0));
	if (err)
		return err;
	g = READ_ONCE(d->lock_grants[id]);
	err = dsm_proto_request(d, dsm_manager(d, id), DSM_LOCK_REQ, id, 0);
	if (!err)
		err = dsm_wait(d, "lock", id, lock_granted, g);
	if (err) {
		/* A late grant leaves the lock held at its manager: the session is broken. */
		clear_bit(id, d->held);
		wake_up_all(&d->wq);
		return err;
	}
	atomic64_inc(&d->st.lock_acquires);
	return 0;
}

static int dsm_unlock(struct dsm_proto *d, u32 id)
{
	int err;

	if (id >= DSM_LOCKS || !test_bit(id, d->held))
		return -EINVAL;
	err = dsm_proto_request(d, dsm_manager(d, id), DSM_UNLOCK, id, 0);
	clear_bit(id, d->held);
	wake_up_all(&d->wq);
	return err;
}

static void dsm_stats_fill(struct dsm_proto *d, struct dsm_stats_user *u)
{
	struct dsm_stats *cs = &d->c->stats;

	memset(u, 0, sizeof(*u));
	u->read_faults = atomic64_read(&d->st.read_faults);
	u->write_faults = atomic64_read(&d->st.write_faults);
	u->read_fault_ns = atomic64_read(&d->st.read_fault_ns);
	u->write_fault_ns = atomic64_read(&d->st.write_fault_ns);
	u->msgs_sent = atomic64_read(&cs->sent);
	u->msgs_received = atomic64_read(&cs->received);
	u->msg_bytes = atomic64_read(&cs->msg_bytes);
	u->data_bytes = atomic64_read(&cs->data_bytes);
	u->invalidations = atomic64_read(&d->st.invalidations);
	u->handled_irq = atomic64_read(&d->st.handled_irq);
	u->handled_process = atomic64_read(&d->st.handled_process);
	u->barriers = atomic64_read(&d->st.barriers);
	u->lock_acquires = atomic64_read(&d->st.lock_acquires);
	u->rdma_reads = atomic64_read(&cs->rdma_reads);
}

int dsm_proto_stats(struct dsm_proto *d, char *out, size_t len)
{
	struct dsm_stats_user u;

	dsm_stats_fill(d, &u);
	return scnprintf(out, len,
			 "rfaults=%llu wfaults=%llu sent=%llu received=%llu "
			 "data_bytes=%llu inv=%llu irq=%llu process=%llu "
			 "rdma_reads=%llu deferred=%lld cqe_errors=%lld "
			 "proto_errors=%lld fenced=%lld held=%lld kept=%lld "
			 "stale=%lld moot=%lld\n",
			 u.read_faults, u.write_faults, u.msgs_sent,
			 u.msgs_received, u.data_bytes, u.invalidations,
			 u.handled_irq, u.handled_process, u.rdma_reads,
			 atomic64_read(&d->c->stats.deferred),
			 atomic64_read(&d->c->stats.cqe_errors),
			 atomic64_read(&d->st.protocol_errors),
			 atomic64_read(&d->st.fenced),
			 atomic64_read(&d->st.held),
			 atomic64_read(&d->st.kept),
			 atomic64_read(&d->st.stale),
			 atomic64_read(&d->st.moot));
}

long dsm_proto_ioctl(struct dsm_proto *d, unsigned int cmd, void __user *arg)
{
	struct dsm_stats_user st;
	struct dsm_info info;
	u32 id;

	if (READ_ONCE(d->dead))
		return -ENODEV;
	switch (cmd) {
	case DSM_IOC_INFO:
		info.self = d->self;
		info.nodes = d->nodes;
		info.pages = d->npages;
		info.page_size = PAGE_SIZE;
		info.user_sim = READ_ONCE(d->usim);
		info.rsvd = 0;
		return copy_to_user(arg, &info, sizeof(info)) ? -EFAULT : 0;
	case DSM_IOC_BARRIER:
		return dsm_barrier(d);
	case DSM_IOC_LOCK:
	case DSM_IOC_UNLOCK:
		if (get_user(id, (u32 __user *)arg))
			return -EFAULT;
		return cmd == DSM_IOC_LOCK ? dsm_lock(d, id) : dsm_unlock(d, id);
	case DSM_IOC_STATS:
		dsm_stats_fill(d, &st);
		return copy_to_user(arg, &st, sizeof(st)) ? -EFAULT : 0;
	case DSM_IOC_SERVE:
	case DSM_IOC_FAULT:
	case DSM_IOC_PROTMAP:
		return dsm_usim_ioctl(d, cmd, arg);
	default:
		return -ENOTTY;
	}
}
