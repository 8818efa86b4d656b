// SPDX-License-Identifier: GPL-2.0
/*
 * hca_probe: the smallest driver that proves a guest reaches its hcabench
 * HCA. It binds the device, checks BAR2's signature and LID, enables MSI-X,
 * then times doorbell -> device -> MSI-X round trips with a mailbox command
 * that asks for a completion event. Results go to the kernel log as
 * "hca_probe:" lines for the test harness. The real ib_core provider comes
 * with issue 4; this module is for image and device-server tests.
 *
 * Locking: one command at a time, issued from probe() only; the interrupt
 * handler touches nothing but the completion.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/interrupt.h>
#include <linux/completion.h>
#include <linux/ktime.h>
#include <linux/sort.h>
#include "hca_abi.h"

#define HCA_PROBE_ROUNDS	200

static int rounds = HCA_PROBE_ROUNDS;
module_param(rounds, int, 0444);
MODULE_PARM_DESC(rounds, "doorbell round trips to time");

struct hca_probe {
	void __iomem *bar0;
	void __iomem *bar2;
	struct completion done;
	atomic_t irqs;
	void __iomem *bar1;
	u32 peer;
	u32 seq;
	u32 eq_ci;
	s64 rtt_ns[HCA_PROBE_ROUNDS];
};

static irqreturn_t hca_probe_irq(int irq, void *data)
{
	struct hca_probe *hp = data;

	atomic_inc(&hp->irqs);
	complete(&hp->done);
	return IRQ_HANDLED;
}

static void __iomem *hca_mbox(struct hca_probe *hp, size_t field)
{
	return hp->bar2 + HCA_BAR2_MAILBOX_OFFSET + field;
}

/* Runs QUERY_PORT with an event; returns the round trip in ns, or < 0. */
static s64 hca_probe_roundtrip(struct hca_probe *hp)
{
	ktime_t start;
	u32 status;

	reinit_completion(&hp->done);
	hp->seq++;
	iowrite32(HCA_CMD_QUERY_PORT,
		  hca_mbox(hp, offsetof(struct hca_cmd_mailbox, opcode)));
	iowrite32(HCA_CMD_FLAG_EVENT,
		  hca_mbox(hp, offsetof(struct hca_cmd_mailbox, flags)));
	iowrite32(hp->seq, hca_mbox(hp, offsetof(struct hca_cmd_mailbox, seq)));
	start = ktime_get();
	iowrite32(hp->peer << HCA_DOORBELL_PEER_SHIFT | HCA_DB_CMD,
		  hp->bar0 + HCA_BAR0_DOORBELL);
	if (!wait_for_completion_timeout(&hp->done, 5 * HZ)) {
		/* Tells a lost doorbell (not done) from a lost interrupt (done). */
		pr_info("hca_probe: no interrupt; command seq=%u done_seq=%u irqs=%d pba=%#x\n",
			hp->seq,
			ioread32(hca_mbox(hp, offsetof(struct hca_cmd_mailbox, done_seq))),
			atomic_read(&hp->irqs), ioread32(hp->bar1 + 2048));
		return -ETIMEDOUT;
	}
	status = ioread32(hca_mbox(hp, offsetof(struct hca_cmd_mailbox, status)));
	/* One event per command: consume it so that EQ 0 never fills. */
	hp->eq_ci++;
	iowrite32(hp->eq_ci, hp->bar2 + HCA_BAR2_EQ_DB_OFFSET);
	if (status != HCA_CMD_OK)
		return -EIO;
	return ktime_to_ns(ktime_sub(ktime_get(), start));
}

static int hca_probe_cmp(const void *a, const void *b)
{
	s64 x = *(const s64 *)a, y = *(const s64 *)b;

	return x < y ? -1 : x > y;
}

static void hca_probe_report(struct pci_dev *pdev, struct hca_probe *hp, int n)
{
	sort(hp->rtt_ns, n, sizeof(s64), hca_probe_cmp, NULL);
	dev_info(&pdev->dev,
		 "hca_probe: doorbell-irq rounds=%d min_ns=%lld median_ns=%lld p99_ns=%lld\n",
		 n, hp->rtt_ns[0], hp->rtt_ns[n / 2], hp->rtt_ns[n * 99 / 100]);
}

static int hca_probe_identify(struct pci_dev *pdev, struct hca_probe *hp)
{
	u32 sig = ioread32(hp->bar2 + offsetof(struct hca_dev_info, signature));
	u32 abi = ioread32(hp->bar2 + offsetof(struct hca_dev_info, abi_version));
	u16 lid = ioread16(hp->bar2 + offsetof(struct hca_dev_info, lid));
	u8 port = ioread8(hp->bar2 + offsetof(struct hca_dev_info, port_state));

	if (sig != HCA_SIGNATURE) {
		dev_info(&pdev->dev, "hca_probe: not an hcabench HCA (signature %#x)\n",
			 sig);
		return -ENODEV;
	}
	hp->peer = ioread32(hp->bar2 + offsetof(struct hca_dev_info, doorbell_peer));
	dev_info(&pdev->dev, "hca_probe: HCA found abi=%u lid=%u port_state=%u peer=%u\n",
		 abi, lid, port, hp->peer);
	return 0;
}

static int hca_probe_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct hca_probe *hp;
	int err, i;
	s64 rtt;

	hp = devm_kzalloc(&pdev->dev, sizeof(*hp), GFP_KERNEL);
	if (!hp)
		return -ENOMEM;
	init_completion(&hp->done);
	err = pcim_enable_device(pdev);
	if (err)
		return err;
	/* MSI-X messages are memory writes by the device: they need bus mastering. */
	pci_set_master(pdev);
	hp->bar0 = pcim_iomap(pdev, 0, 0);
	hp->bar1 = pcim_iomap(pdev, 1, 0);
	hp->bar2 = pcim_iomap(pdev, 2, 0);
	if (!hp->bar0 || !hp->bar1 || !hp->bar2)
		return -ENOMEM;
	err = hca_probe_identify(pdev, hp);
	if (err)
		return err;
	err = pci_alloc_irq_vectors(pdev, HCA_NUM_VECTORS, HCA_NUM_VECTORS,
				    PCI_IRQ_MSIX);
	if (err < 0)
		return err;
	err = devm_request_irq(&pdev->dev, pci_irq_vector(pdev, HCA_VEC_ASYNC),
			       hca_probe_irq, 0, "hca_probe-async", hp);
	if (err)
		goto err_vectors;
	/* Events posted before MSI-X was on are in EQ 0: skip them. */
	hp->eq_ci = 0;
	while (ioread8(hp->bar2 + HCA_BAR2_EQ_OFFSET + 16 * (hp->eq_ci & (HCA_EQ_ENTRIES - 1)) +
		       HCA_EQE_OWNER_OFFSET) == hca_owner_bit(hp->eq_ci, HCA_EQ_LOG_ENTRIES))
		hp->eq_ci++;
	iowrite32(hp->eq_ci, hp->bar2 + HCA_BAR2_EQ_DB_OFFSET);
	rounds = clamp(rounds, 1, HCA_PROBE_ROUNDS);
	for (i = 0; i < rounds; i++) {
		rtt = hca_probe_roundtrip(hp);
		if (rtt < 0) {
			dev_info(&pdev->dev, "hca_probe: doorbell round %d failed: %lld\n",
				 i, rtt);
			err = (int)rtt;
			goto err_irq;
		}
		hp->rtt_ns[i] = rtt;
	}
	hca_probe_report(pdev, hp, rounds);
	pci_set_drvdata(pdev, hp);
	return 0;

err_irq:
	devm_free_irq(&pdev->dev, pci_irq_vector(pdev, HCA_VEC_ASYNC), hp);
err_vectors:
	pci_free_irq_vectors(pdev);
	return err;
}

static void hca_probe_remove(struct pci_dev *pdev)
{
	struct hca_probe *hp = pci_get_drvdata(pdev);

	devm_free_irq(&pdev->dev, pci_irq_vector(pdev, HCA_VEC_ASYNC), hp);
	pci_free_irq_vectors(pdev);
}

static const struct pci_device_id hca_probe_ids[] = {
	{ PCI_DEVICE(HCA_PCI_VENDOR_IVSHMEM, HCA_PCI_DEVICE_IVSHMEM) },
	{ PCI_DEVICE(HCA_PCI_VENDOR_HCABENCH, HCA_PCI_DEVICE_HCABENCH) },
	{ }
};
MODULE_DEVICE_TABLE(pci, hca_probe_ids);

static struct pci_driver hca_probe_driver = {
	.name = "hca_probe",
	.id_table = hca_probe_ids,
	.probe = hca_probe_probe,
	.remove = hca_probe_remove,
};
module_pci_driver(hca_probe_driver);

MODULE_DESCRIPTION("hcabench HCA presence, doorbell and MSI-X probe");
MODULE_LICENSE("GPL");
