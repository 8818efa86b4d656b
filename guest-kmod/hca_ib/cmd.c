// SPDX-License-Identifier: GPL-2.0
/*
 * The command mailbox in BAR2. One command at a time (cmd_mutex); the
 * device signals completion with an EV_CMD_DONE event on EQ 0, whose
 * handler calls hca_cmd_complete(). Commands therefore sleep and must not
 * be issued from atomic context.
 */
#include <linux/delay.h>
#include "hca_ib.h"

#define MBOX(field) (HCA_BAR2_MAILBOX_OFFSET + \
		     offsetof(struct hca_cmd_mailbox, field))

static int hca_status_errno(u32 status)
{
	switch (status) {
	case HCA_CMD_OK:
		return 0;
	case HCA_CMD_BAD_HANDLE:
		return -ENOENT;
	case HCA_CMD_BUSY:
		return -EBUSY;
	case HCA_CMD_NO_RESOURCES:
		return -ENOMEM;
	case HCA_CMD_BAD_ADDRESS:
		return -EFAULT;
	case HCA_CMD_FATAL:
		return -EIO;
	case HCA_CMD_BAD_KEY:
		return -EACCES;
	default:
		return -EINVAL;
	}
}

/* Called from the EQ 0 interrupt handler. */
void hca_cmd_complete(struct hca_dev *dev, u32 seq, u32 status)
{
	if (seq != READ_ONCE(dev->cmd_seq))
		return;
	dev->cmd_status = status;
	complete(&dev->cmd_done);
}

static int hca_cmd_wait(struct hca_dev *dev, u32 seq)
{
	unsigned long left = msecs_to_jiffies(HCA_IB_CMD_TIMEOUT_MS);
	u32 syndrome;

	if (wait_for_completion_timeout(&dev->cmd_done, left))
		return 0;
	/* A device reset underneath the driver has no EQ to answer on. */
	syndrome = ioread32(dev->bar2 + offsetof(struct hca_dev_info,
						 catas_syndrome));
	if (syndrome == HCA_CATAS_RESET) {
		hca_catastrophic(dev, syndrome);
		return 0;
	}
	/* A lost interrupt still leaves done_seq behind: trust BAR2. */
	if (ioread32(dev->bar2 + MBOX(done_seq)) == seq) {
		dev->cmd_status = ioread32(dev->bar2 + MBOX(status));
		dev_warn(&dev->pdev->dev, "command %u done without its event\n", seq);
		return 0;
	}
	return -ETIMEDOUT;
}

int hca_cmd(struct hca_dev *dev, u32 opcode, const void *in, size_t in_len,
	    void *out, size_t out_len)
{
	u32 seq;
	int err;

	if (in_len > sizeof_field(struct hca_cmd_mailbox, input) ||
	    out_len > sizeof_field(struct hca_cmd_mailbox, output))
		return -EINVAL;
	if (hca_lost(dev))
		return hca_cmd_lost(opcode, in, in_len);
	mutex_lock(&dev->cmd_mutex);
	memset_io(dev->bar2 + MBOX(input), 0,
		  sizeof_field(struct hca_cmd_mailbox, input));
	if (in_len)
		memcpy_toio(dev->bar2 + MBOX(input), in, in_len);
	iowrite32(opcode, dev->bar2 + MBOX(opcode));
	iowrite32(HCA_CMD_FLAG_EVENT, dev->bar2 + MBOX(flags));
	reinit_completion(&dev->cmd_done);
	seq = dev->cmd_seq + 1;
	WRITE_ONCE(dev->cmd_seq, seq);
	/* The mailbox contents must be visible before the new seq. */
	wmb();
	iowrite32(seq, dev->bar2 + MBOX(seq));
	hca_ring(dev, HCA_DB_CMD);
	err = hca_cmd_wait(dev, seq);
	/* A refusal may be a function reset underneath that has not been seen yet. */
	if (!err && dev->cmd_status != HCA_CMD_OK &&
	    ioread32(dev->bar2 + offsetof(struct hca_dev_info, catas_syndrome)) ==
	    HCA_CATAS_RESET)
		hca_catastrophic(dev, HCA_CATAS_RESET);
	if (hca_lost(dev)) {
		err = hca_cmd_lost(opcode, in, in_len);
	} else if (!err) {
		err = hca_status_errno(dev->cmd_status);
		if (!err && out_len)
			memcpy_fromio(out, dev->bar2 + MBOX(output), out_len);
	}
	mutex_unlock(&dev->cmd_mutex);
	if (err)
		dev_dbg(&dev->pdev->dev, "command %#x failed: %d (status %u)\n",
			opcode, err, dev->cmd_status);
	return err;
}

/* The commands that take one handle and return nothing. */
int hca_cmd_handle(struct hca_dev *dev, u32 opcode, u32 handle)
{
	struct hca_cmd_handle h = { .handle = handle };

	return hca_cmd(dev, opcode, &h, sizeof(h), NULL, 0);
}
