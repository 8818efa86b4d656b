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

/* Any context: from the async EQ's interrupt or the health check. */
void hca_catastrophic(struct hca_dev *dev, u32 syndrome)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = IB_EVENT_DEVICE_FATAL,
	};
	struct hca_recovery *r;

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

	if (syndrome) {
		hca_catastrophic(dev, syndrome);
		return;
	}
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
