// SPDX-License-Identifier: GPL-2.0
/*
 * The simulation of a user-level DSM, the paper's section 5.1, for the
 * comparison with handling the protocol in the completion handler. Its
 * three changes:
 *
 * 1. "Whenever a completion notification is issued, the interrupt handler
 *    pushes a signal to the application, which in turn passes control to
 *    the driver for receive processing": every message is queued here and
 *    the process gets SIGIO (O_ASYNC on /dev/dsm); libdsm's service thread
 *    takes it and calls DSM_IOC_SERVE, which runs the unchanged handlers
 *    in its process context.
 * 2. "Before each protocol action that would require a system call, a 1 us
 *    delay": waking the application's waiting threads (proto.c, wake_app).
 *    The other calls a user-level DSM makes are real system calls here.
 * 3. "Memory protection changes by the OS implementation (sys_mprotect)
 *    rather than the primitive": a handler's protection change is recorded
 *    and returned by SERVE, and the service thread calls mprotect() for it
 *    before its next SERVE; messages (page data among them) are held until
 *    then. An access to a page mprotect protects is a SIGSEGV, which libdsm
 *    turns into DSM_IOC_FAULT, as a user-level DSM's fault handler would.
 *
 * The application code and the protocol handlers are the same in every mode.
 */
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include "proto.h"
#include "proto_int.h"
#include "region.h"

struct dsm_usim_msg {
	struct list_head link;
	u32 peer;
	struct dsm_pmsg m;
};

/* Signals the process; SIGIO is lost on nobody: SERVE drains the whole queue. */
void dsm_usim_kick(struct dsm_proto *d)
{
	kill_fasync(&d->fasync, SIGIO, POLL_IN);
}

/* Any context. -EAGAIN (no memory): the caller retries from process context. */
int dsm_usim_queue(struct dsm_proto *d, u32 peer, const void *msg)
{
	struct dsm_usim_msg *q = kmalloc(sizeof(*q), GFP_ATOMIC);
	unsigned long flags;

	if (!q)
		return -EAGAIN;
	q->peer = peer;
	memcpy(&q->m, msg, sizeof(q->m));
	spin_lock_irqsave(&d->usim_lock, flags);
	list_add_tail(&q->link, &d->usim_q);
	spin_unlock_irqrestore(&d->usim_lock, flags);
	dsm_usim_kick(d);
	return 0;
}

static struct dsm_usim_msg *usim_pop(struct dsm_proto *d)
{
	struct dsm_usim_msg *q;
	unsigned long flags;

	spin_lock_irqsave(&d->usim_lock, flags);
	q = list_first_entry_or_null(&d->usim_q, struct dsm_usim_msg, link);
	if (q)
		list_del(&q->link);
	spin_unlock_irqrestore(&d->usim_lock, flags);
	return q;
}

static void usim_push_front(struct dsm_proto *d, struct dsm_usim_msg *q)
{
	unsigned long flags;

	spin_lock_irqsave(&d->usim_lock, flags);
	list_add(&q->link, &d->usim_q);
	spin_unlock_irqrestore(&d->usim_lock, flags);
}

static bool usim_queued(struct dsm_proto *d)
{
	unsigned long flags;
	bool any;

	spin_lock_irqsave(&d->usim_lock, flags);
	any = !list_empty(&d->usim_q);
	spin_unlock_irqrestore(&d->usim_lock, flags);
	return any;
}

/* A message may record up to this many changes (its own and its self messages'). */
#define DSM_USIM_OPS_PER_MSG	16

static long usim_serve(struct dsm_proto *d, struct dsm_serve __user *arg)
{
	struct dsm_prot_op *ops;
	struct dsm_usim_msg *q;
	struct dsm_serve s;
	long err = 0;
	u32 n;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	if (s.max < DSM_USIM_OPS)
		return -EINVAL;
	ops = kmalloc_array(DSM_USIM_OPS, sizeof(*ops), GFP_KERNEL);
	if (!ops)
		return -ENOMEM;
	mutex_lock(&d->usim_serve);
	WRITE_ONCE(d->usim_server, current);
	/* The caller applied what the last call returned. */
	dsm_proto_usim_applied(d);
	s.handled = 0;
	while ((q = usim_pop(d))) {
		if (READ_ONCE(d->usim_nops) + DSM_USIM_OPS_PER_MSG > DSM_USIM_OPS ||
		    dsm_proto_handle_now(d, q->peer, &q->m) == -EAGAIN) {
			usim_push_front(d, q);
			break;
		}
		kfree(q);
		s.handled++;
	}
	spin_lock(&d->lock);
	n = d->usim_nops;
	memcpy(ops, d->usim_ops, n * sizeof(*ops));
	d->usim_nops = 0;
	d->usim_handed = d->usim_recorded;
	spin_unlock(&d->lock);
	WRITE_ONCE(d->usim_server, NULL);
	s.n = n;
	s.left = usim_queued(d);
	if (copy_to_user(u64_to_user_ptr(s.ops), ops, n * sizeof(*ops)) ||
	    copy_to_user(arg, &s, sizeof(s)))
		err = -EFAULT;
	mutex_unlock(&d->usim_serve);
	kfree(ops);
	return err;
}

static long usim_fault(struct dsm_proto *d, struct dsm_fault_req __user *arg)
{
	struct dsm_fault_req f;
	u64 need;
	int err;

	if (copy_from_user(&f, arg, sizeof(f)))
		return -EFAULT;
	if (f.page >= d->npages)
		return -EINVAL;
	err = dsm_proto_fault_wait(d, f.page, f.write);
	if (err)
		return err;
	/*
	 * The access is allowed; the retry works once the process applied
	 * every change recorded up to now (the grant's among them).
	 */
	need = READ_ONCE(d->usim_recorded);
	if (wait_event_killable(d->wq, READ_ONCE(d->usim_applied) >= need ||
				READ_ONCE(d->dead)))
		return -EINTR;
	return READ_ONCE(d->dead) ? -ENODEV : 0;
}

static long usim_protmap(struct dsm_proto *d, u64 __user *arg)
{
	u8 buf[256];
	u64 to;
	u32 i, k;

	if (get_user(to, arg))
		return -EFAULT;
	for (i = 0; i < d->npages; i += k) {
		for (k = 0; k < sizeof(buf) && i + k < d->npages; k++)
			buf[k] = dsm_region_prot(d->r, i + k);
		if (copy_to_user(u64_to_user_ptr(to + i), buf, k))
			return -EFAULT;
	}
	return 0;
}

long dsm_usim_ioctl(struct dsm_proto *d, unsigned int cmd, void __user *arg)
{
	if (!READ_ONCE(d->usim))
		return -EPERM;
	switch (cmd) {
	case DSM_IOC_SERVE:
		return usim_serve(d, arg);
	case DSM_IOC_FAULT:
		return usim_fault(d, arg);
	case DSM_IOC_PROTMAP:
		return usim_protmap(d, arg);
	}
	return -ENOTTY;
}

int dsm_proto_fasync(struct dsm_proto *d, int fd, struct file *f, int on)
{
	return fasync_helper(fd, f, on, &d->fasync);
}

void dsm_usim_free(struct dsm_proto *d)
{
	struct dsm_usim_msg *q;

	while ((q = usim_pop(d)))
		kfree(q);
	kfree(d->usim_ops);
}
