// SPDX-License-Identifier: GPL-2.0
/*
 * Ping-pong. A message is a SEND with immediate data = its header word:
 * bytes 0..3 hold the word (sequence number, VB_PONG set on replies), the
 * last four bytes its complement, everything between pat(i). The server
 * checks and answers each ping; the client checks each pong, times the
 * round trip and sends the next ping. Where that happens is the mode:
 * a busy-polling thread, the CQ completion handler (hard interrupt
 * context), a workqueue, or a user process woken by the handler.
 */
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>
#include "hcab_compat.h"
#include "vbench.h"

#define VB_RUN_TIMEOUT	(60 * HZ)

void vb_fill(u8 *buf, u32 size, u32 word0)
{
	put_unaligned_le32(word0, buf);
	put_unaligned_le32(~word0, buf + size - 4);
}

bool vb_check(const u8 *buf, u32 size, u32 word0, bool full)
{
	if (size < 8 || size > VB_MAX_MSG)
		return false;
	if (get_unaligned_le32(buf) != word0 ||
	    get_unaligned_le32(buf + size - 4) != ~word0)
		return false;
	return !full || !memcmp(buf + 4, vb_pattern + 4, size - 8);
}

static void vb_server_msg(const struct ib_wc *wc, u8 *buf, u32 word0)
{
	u32 len = wc->byte_len;

	if (!vb_check(buf, len, word0, vb->verify) || (word0 & VB_PONG)) {
		vb->errors++;
		return;
	}
	if (len != vb->last_size) {
		/* The previous size's trailer sits inside this one's body. */
		memcpy(vb->sbuf, vb_pattern, VB_MAX_MSG);
		vb->last_size = len;
	}
	vb_fill(vb->sbuf, len, word0 | VB_PONG);
	if (vb_post_send(len, word0 | VB_PONG, false))
		vb->errors++;
	vb->done++;
}

static void vb_client_msg(const struct ib_wc *wc, u8 *buf, u32 word0)
{
	u64 ns = ktime_to_ns(ktime_sub(ktime_get(), vb->t0));

	if (wc->byte_len != vb->size || word0 != (vb->seq | VB_PONG) ||
	    !vb_check(buf, vb->size, word0, vb->verify))
		vb->errors++;
	if (vb->done >= vb->warmup) {
		if (vb->nsamples < vb->iters)
			vb->samples[vb->nsamples++] = min_t(u64, ns, U32_MAX);
		vb->sum_ns += ns;
		vb->min_ns = min(vb->min_ns, ns);
		vb->max_ns = max(vb->max_ns, ns);
	}
	vb->done++;
	vb->seq++;
	if (vb->done == vb->iters) {
		complete(&vb->finished);
		return;
	}
	vb_fill(vb->sbuf, vb->size, vb->seq);
	vb->t0 = ktime_get();
	if (vb_post_send(vb->size, vb->seq, false)) {
		vb->errors++;
		complete(&vb->finished);
	}
}

static void vb_on_wc(const struct ib_wc *wc)
{
	u32 slot = wc->wr_id;
	u8 *buf;
	u32 word0;

	if (wc->status != IB_WC_SUCCESS) {
		pr_warn("vbench: completion error %s\n", ib_wc_status_msg(wc->status));
		vb->errors++;
		if (vb->role == VB_CLIENT)
			complete(&vb->finished);
		return;
	}
	if (!(wc->opcode & IB_WC_RECV) || slot >= VB_RECVS)
		return;
	buf = vb->rbuf + (size_t)slot * VB_MAX_MSG;
	word0 = be32_to_cpu(wc->ex.imm_data);
	/* The buffer's contents are read before it goes back to the device. */
	if (vb->role == VB_SERVER)
		vb_server_msg(wc, buf, word0);
	else if (vb->role == VB_CLIENT)
		vb_client_msg(wc, buf, word0);
	if (vb_post_recv(slot))
		vb->errors++;
}

/* Returns how many completions it handled. */
static int vb_poll_once(void)
{
	struct ib_wc wc[16];
	int n, i, total = 0;

	while ((n = ib_poll_cq(vb->cq, ARRAY_SIZE(wc), wc)) > 0) {
		for (i = 0; i < n; i++)
			vb_on_wc(&wc[i]);
		total += n;
	}
	return total;
}

/* Poll, re-arm, and poll again if something slipped in before the arm. */
void vb_drain_cq(void)
{
	do {
		vb_poll_once();
	} while (ib_req_notify_cq(vb->cq, IB_CQ_NEXT_COMP |
				  IB_CQ_REPORT_MISSED_EVENTS) > 0);
}

void vb_work_fn(struct work_struct *w)
{
	vb_drain_cq();
}

void vb_comp_handler(struct ib_cq *cq, void *ctx)
{
	switch (READ_ONCE(vb->mode)) {
	case VB_ISR:
		if (cq_handler_may_poll()) {
			vb_drain_cq();
			break;
		}
		/* Under the provider's CQ lock: polling here would hang. */
		vb->deferred++;
		pr_info_once("vbench: %s calls completion handlers under its CQ lock: isr mode polls from the workqueue there\n",
			     dev_name(&cq->device->dev));
		queue_work(vb->wq, &vb->work);
		break;
	case VB_WQ:
		queue_work(vb->wq, &vb->work);
		break;
	case VB_USER:
		atomic_inc(&vb->events);
		wake_up(&vb->waitq);
		break;
	default:
		break;
	}
}

static int vb_poller(void *unused)
{
	while (!kthread_should_stop()) {
		if (!vb_poll_once())
			cond_resched();
	}
	return 0;
}

static void vb_reset_stats(void)
{
	vb->done = 0;
	vb->errors = 0;
	vb->deferred = 0;
	vb->seq = 0;
	vb->sum_ns = 0;
	vb->max_ns = 0;
	vb->min_ns = U64_MAX;
	vb->last_size = 0;
	vb->nsamples = 0;
	memcpy(vb->sbuf, vb_pattern, VB_MAX_MSG);
	reinit_completion(&vb->finished);
}

/* Hands the CQ to the context `mode` names. */
static int vb_start(enum vb_role role, enum vb_mode mode)
{
	vb->role = role;
	WRITE_ONCE(vb->mode, mode);
	switch (mode) {
	case VB_POLL:
		if (role != VB_SERVER)
			return 0;
		vb->poller = kthread_run(vb_poller, NULL, "vbench-poll");
		if (IS_ERR(vb->poller)) {
			int err = PTR_ERR(vb->poller);

			vb->poller = NULL;
			return err;
		}
		return 0;
	case VB_ISR:
	case VB_WQ:
		/* Anything already queued is handled now, then the CQ is armed. */
		vb_comp_handler(vb->cq, NULL);
		if (mode == VB_WQ)
			flush_workqueue(vb->wq);
		return 0;
	case VB_USER:
		vb->user_seen = atomic_read(&vb->events);
		return 0;
	default:
		return -EINVAL;
	}
}

void vb_stop(void)
{
	WRITE_ONCE(vb->mode, VB_IDLE);
	if (vb->poller) {
		kthread_stop(vb->poller);
		vb->poller = NULL;
	}
	flush_workqueue(vb->wq);
	wake_up(&vb->waitq);
	vb->role = VB_NONE;
}

int vb_serve(enum vb_mode mode)
{
	if (!vb->qp)
		return -ENOTCONN;
	vb_stop();
	vb_reset_stats();
	return vb_start(VB_SERVER, mode);
}

static void vb_client_poll(void)
{
	unsigned long deadline = jiffies + VB_RUN_TIMEOUT;

	while (vb->done < vb->iters && !completion_done(&vb->finished)) {
		if (!vb_poll_once()) {
			if (time_after(jiffies, deadline))
				break;
			cond_resched();
		}
	}
}

static int vb_cmp_u32(const void *a, const void *b)
{
	u32 x = *(const u32 *)a, y = *(const u32 *)b;

	return x < y ? -1 : x > y;
}

static u64 vb_median(void)
{
	if (!vb->nsamples)
		return 0;
	sort(vb->samples, vb->nsamples, sizeof(u32), vb_cmp_u32, NULL);
	return vb->samples[vb->nsamples / 2];
}

int vb_ping(enum vb_mode mode, u32 size, u32 iters, char *out, size_t len)
{
	u32 counted;
	int err;

	if (!vb->qp)
		return -ENOTCONN;
	if (size < 8 || size > VB_MAX_MSG || !iters || iters > VB_MAX_ITERS ||
	    mode == VB_USER)
		return -EINVAL;
	vb_stop();
	kvfree(vb->samples);
	vb->samples = kvmalloc_array(iters, sizeof(u32), GFP_KERNEL);
	if (!vb->samples)
		return -ENOMEM;
	vb_reset_stats();
	vb->size = size;
	vb->iters = iters;
	vb->warmup = min(10u, iters / 10);
	err = vb_start(VB_CLIENT, mode);
	if (err)
		return err;
	vb_fill(vb->sbuf, size, 0);
	vb->t0 = ktime_get();
	err = vb_post_send(size, 0, false);
	if (!err && mode == VB_POLL)
		vb_client_poll();
	else if (!err)
		wait_for_completion_timeout(&vb->finished, VB_RUN_TIMEOUT);
	vb_stop();
	if (err)
		return err;
	counted = vb->done > vb->warmup ? vb->done - vb->warmup : 0;
	return scnprintf(out, len,
			 "size=%u iters=%u done=%u errors=%u rtt_avg_ns=%llu rtt_min_ns=%llu rtt_max_ns=%llu rtt_median_ns=%llu deferred=%u\n",
			 size, iters, vb->done, vb->errors,
			 counted ? div_u64(vb->sum_ns, counted) : 0,
			 counted ? vb->min_ns : 0, vb->max_ns, vb_median(),
			 vb->deferred);
}

/*
 * User mode, read(): the next received message, copied out. Sleeps until
 * the completion handler says the CQ moved; the CQ is polled here, in
 * process context, as a user-level protocol handler would.
 */
ssize_t vb_user_read(char __user *buf, size_t len)
{
	struct ib_wc wc;
	u32 slot, n;
	int seen;

	for (;;) {
		if (READ_ONCE(vb->mode) != VB_USER)
			return 0;
		if (ib_poll_cq(vb->cq, 1, &wc) == 1) {
			if (wc.status != IB_WC_SUCCESS)
				return -EIO;
			if (!(wc.opcode & IB_WC_RECV) || wc.wr_id >= VB_RECVS)
				continue;
			slot = wc.wr_id;
			n = min_t(u32, len, wc.byte_len);
			if (copy_to_user(buf, vb->rbuf + (size_t)slot * VB_MAX_MSG, n))
				return -EFAULT;
			return vb_post_recv(slot) ?: n;
		}
		seen = atomic_read(&vb->events);
		if (ib_req_notify_cq(vb->cq, IB_CQ_NEXT_COMP |
				     IB_CQ_REPORT_MISSED_EVENTS) > 0)
			continue;
		if (wait_event_interruptible(vb->waitq,
					     atomic_read(&vb->events) != seen ||
					     READ_ONCE(vb->mode) != VB_USER))
			return -ERESTARTSYS;
	}
}

/* User mode, write(): send this message (its first word is the header). */
ssize_t vb_user_write(const char __user *buf, size_t len)
{
	int err;

	if (READ_ONCE(vb->mode) != VB_USER)
		return -ENOTCONN;
	if (len < 8 || len > VB_MAX_MSG)
		return -EINVAL;
	if (copy_from_user(vb->sbuf, buf, len))
		return -EFAULT;
	err = vb_post_send(len, get_unaligned_le32(vb->sbuf), false);
	return err ?: len;
}
