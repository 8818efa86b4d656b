// SPDX-License-Identifier: GPL-2.0
/*
 * Catastrophic errors (HCA_CAP_RESET): the device died under its consumers.
 * It says so with an EV_CATAS event and, for a lost interrupt, in BAR2's
 * catas_syndrome, which a health check reads every second (as mthca polls
 * its catastrophic error buffer). The driver then raises
 * IB_EVENT_DEVICE_FATAL and recovers as mlx5 does: its PCI function is
 * unbound, so that ib_core's clients tear down (the device still flushes
 * and destroys what they had), and bound again; probe resets the function
 * and registers a new ib_device.
 *
 * A reset underneath the driver (HCA_CATAS_RESET: a hypervisor's or a
 * firmware's) leaves a device that knows none of the driver's queues, EQs
 * included, so only the health check hears of it. Nothing will complete
 * what consumers posted, nor the WRs their teardown posts to drain a QP
 * (ib_drain_qp). So, as mlx5 does once its device is dead, the driver
 * completes every outstanding WR itself with IB_WC_WR_FLUSH_ERR (poll_cq,
 * cq.c) and calls the handlers of the CQs their consumers armed; and it
 * sends no more commands: what tears down succeeds, the device holding
 * nothing to tear down, and the rest fails with -EIO.
 */
#include <linux/delay.h>
#include <linux/workqueue.h>
#include "hca_ib.h"

#define HCA_HEALTH_PERIOD	HZ
#define MBOX(field) (HCA_BAR2_MAILBOX_OFFSET + \
		     offsetof(struct hca_cmd_mailbox, field))

/*
 * Recovery runs here rather than on a work item of the device: it unbinds
 * the device, and the unbinding frees what such an item would live in.
 * Module exit drains it.
 */
static struct workqueue_struct *hca_recovery_wq;
/* Set while the module goes: no recovery may bind the device again. */
static bool hca_exiting;

struct hca_recovery {
	struct work_struct work;
	struct pci_dev *pdev;
};

static void hca_recover(struct work_struct *work)
{
	struct hca_recovery *r = container_of(work, struct hca_recovery, work);
	struct device *d = &r->pdev->dev;
	int ret;

	dev_info(d, "catastrophic error: unbinding to reset the function\n");
	device_release_driver(d);
	ret = device_attach(d);
	if (ret > 0)
		dev_info(d, "recovered from a catastrophic error\n");
	else
		dev_err(d, "no recovery from a catastrophic error (%d)\n", ret);
	pci_dev_put(r->pdev);
	kfree(r);
}

/* A command to a device that lost its state: what it would have done. */
int hca_cmd_lost(u32 opcode, const void *in, size_t in_len)
{
	const struct hca_cmd_modify_qp *m = in;

	switch (opcode) {
	case HCA_CMD_DEALLOC_PD:
	case HCA_CMD_DEREG_MR:
	case HCA_CMD_DEALLOC_MW:
	case HCA_CMD_DESTROY_CQ:
	case HCA_CMD_DESTROY_QP:
	case HCA_CMD_DETACH_MCAST:
	case HCA_CMD_DESTROY_SRQ:
	case HCA_CMD_SET_PORT_CAP:
		return 0;
	case HCA_CMD_MODIFY_QP:
		/* To RESET or ERR: where the reset left every QP anyway. */
		if (in_len >= sizeof(*m) && (m->attr_mask & HCA_QP_ATTR_STATE) &&
		    (m->attr.state == HCA_QPS_RESET ||
		     m->attr.state == HCA_QPS_ERR))
			return 0;
		return -EIO;
	default:
		return -EIO;
	}
}

/*
 * Calls the handler of each kernel CQ whose consumer armed it and that has
 * work to flush, as a completion event would (eq.c: under table_lock,
 * interrupts off). A handler that arms its CQ again schedules this again.
 */
static void hca_sw_notify_work(struct work_struct *work)
{
	struct hca_dev *dev = container_of(work, struct hca_dev, sw_notify);
	unsigned long flags;
	struct hca_cq *cq;
	bool call;
	u32 i;

	/* Softirqs the handlers raise (NAPI, irq_poll) run when this ends. */
	local_bh_disable();
	spin_lock_irqsave(&dev->table_lock, flags);
	for (i = 0; i < HCA_MAX_CQ; i++) {
		cq = dev->cqs[i];
		if (!cq || cq->uc || !cq->ibcq.comp_handler)
			continue;
		spin_lock(&cq->lock);
		call = cq->sw_armed && hca_cq_flush_pending(cq);
		if (call)
			cq->sw_armed = false;
		spin_unlock(&cq->lock);
		if (call)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	}
	spin_unlock_irqrestore(&dev->table_lock, flags);
	local_bh_enable();
}

void hca_sw_notify_init(struct hca_dev *dev)
{
	INIT_WORK(&dev->sw_notify, hca_sw_notify_work);
}

/*
 * An event of @qp's that the device, having lost its state, cannot raise.
 * Process context; the consumer holds the QP.
 */
void hca_sw_qp_event(struct hca_dev *dev, struct hca_qp *qp,
		     enum ib_event_type type)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.element.qp = &qp->ibqp,
		.event = type,
	};
	unsigned long flags;

	if (!qp->ibqp.event_handler)
		return;
	/* Handlers expect the EQ's context: interrupts off. */
	local_irq_save(flags);
	qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	local_irq_restore(flags);
}

/* Work was posted or a CQ armed on a device that lost its state. */
void hca_sw_notify(struct hca_dev *dev)
{
	schedule_work(&dev->sw_notify);
}

/*
 * Any context: from the async EQ's interrupt, the health check, or a
 * command that waited for an event in vain.
 */
void hca_catastrophic(struct hca_dev *dev, u32 syndrome)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = IB_EVENT_DEVICE_FATAL,
	};
	struct hca_recovery *r;

	/* Even in a recovery already under way: its teardown needs it. */
	if (syndrome == HCA_CATAS_RESET &&
	    !test_and_set_bit(HCA_CATAS_LOST, &dev->catas)) {
		dev_err(&dev->pdev->dev,
			"function reset underneath the driver: completing its work in software\n");
		/* A command waiting for its event goes on without the device. */
		complete(&dev->cmd_done);
		hca_sw_notify(dev);
	}
	if (test_and_set_bit(HCA_CATAS_SEEN, &dev->catas))
		return;
	dev_err(&dev->pdev->dev, "catastrophic error, syndrome %u\n", syndrome);
	if (test_bit(HCA_CATAS_REGISTERED, &dev->catas))
		ib_dispatch_event(&ev);
	if (READ_ONCE(hca_exiting))
		return;
	r = kzalloc(sizeof(*r), GFP_ATOMIC);
	if (!r) {
		dev_err(&dev->pdev->dev,
			"no memory to recover: unbind and bind the device\n");
		return;
	}
	INIT_WORK(&r->work, hca_recover);
	r->pdev = pci_dev_get(dev->pdev);
	queue_work(hca_recovery_wq, &r->work);
}

static void hca_health_check(struct work_struct *work)
{
	struct hca_dev *dev = container_of(to_delayed_work(work),
					   struct hca_dev, health);
	u32 syndrome = ioread32(dev->bar2 +
				offsetof(struct hca_dev_info, catas_syndrome));

	if (syndrome)
		hca_catastrophic(dev, syndrome);
	/*
	 * Until the device is known lost: a reset underneath during the
	 * recovery from a catastrophic error must still be seen, or a drain
	 * posted after it would wait for ever.
	 */
	if (syndrome != HCA_CATAS_RESET)
		schedule_delayed_work(&dev->health, HCA_HEALTH_PERIOD);
}

void hca_health_start(struct hca_dev *dev)
{
	INIT_DELAYED_WORK(&dev->health, hca_health_check);
	if (dev->caps & HCA_CAP_RESET)
		schedule_delayed_work(&dev->health, HCA_HEALTH_PERIOD);
}

void hca_health_stop(struct hca_dev *dev)
{
	cancel_delayed_work_sync(&dev->health);
}

/*
 * RESET, polled: it empties the EQs its completion would travel on. Before
 * the EQs are set up; afterwards the mailbox goes on from this command.
 */
int hca_reset(struct hca_dev *dev)
{
	unsigned long end = jiffies + msecs_to_jiffies(HCA_IB_CMD_TIMEOUT_MS);
	u32 seq = dev->cmd_seq + 1;

	if (!(dev->caps & HCA_CAP_RESET))
		return 0;
	memset_io(dev->bar2 + MBOX(input), 0,
		  sizeof_field(struct hca_cmd_mailbox, input));
	iowrite32(HCA_CMD_RESET, dev->bar2 + MBOX(opcode));
	iowrite32(0, dev->bar2 + MBOX(flags));
	wmb();
	iowrite32(seq, dev->bar2 + MBOX(seq));
	hca_ring(dev, HCA_DB_CMD);
	while (ioread32(dev->bar2 + MBOX(done_seq)) != seq) {
		if (time_after(jiffies, end)) {
			dev_err(&dev->pdev->dev, "the device did not reset\n");
			return -ETIMEDOUT;
		}
		usleep_range(200, 1000);
	}
	dev->cmd_seq = seq;
	if (ioread32(dev->bar2 + MBOX(status)) != HCA_CMD_OK)
		return -EIO;
	return 0;
}

int hca_recovery_init(void)
{
	hca_recovery_wq = alloc_ordered_workqueue("hca_ib_recovery", 0);
	return hca_recovery_wq ? 0 : -ENOMEM;
}

/* Before the driver unregisters: a recovery under way binds no more. */
void hca_recovery_stop(void)
{
	WRITE_ONCE(hca_exiting, true);
	flush_workqueue(hca_recovery_wq);
}

void hca_recovery_exit(void)
{
	destroy_workqueue(hca_recovery_wq);
}
