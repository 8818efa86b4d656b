// SPDX-License-Identifier: GPL-2.0
/*
 * hca_ib: binds the hcabench HCA's PCI function (ivshmem-doorbell with
 * the "HCAB" signature in BAR2 under QEMU, or the VMM's own IDs), brings
 * up MSI-X and the mailbox, and registers an InfiniBand device with
 * ib_core, so that unmodified kernel verbs consumers run over it.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include "hca_ib.h"

#define INFO(field) offsetof(struct hca_dev_info, field)

static int hca_identify(struct hca_dev *dev)
{
	struct device *d = &dev->pdev->dev;
	u32 sig = ioread32(dev->bar2 + INFO(signature));
	u32 abi = ioread32(dev->bar2 + INFO(abi_version));

	if (sig != HCA_SIGNATURE) {
		dev_info(d, "no hcabench HCA behind this function (signature %#x)\n", sig);
		return -ENODEV;
	}
	if (abi != HCA_ABI_VERSION) {
		dev_err(d, "device ABI %u, driver ABI %u\n", abi, HCA_ABI_VERSION);
		return -ENODEV;
	}
	dev->doorbell_peer = ioread32(dev->bar2 + INFO(doorbell_peer));
	dev->caps = ioread32(dev->bar2 + INFO(caps));
	/* Continue the mailbox sequence where a previous load left it. */
	dev->cmd_seq = ioread32(dev->bar2 + HCA_BAR2_MAILBOX_OFFSET +
				offsetof(struct hca_cmd_mailbox, done_seq));
	return 0;
}

static int hca_map(struct hca_dev *dev)
{
	struct pci_dev *pdev = dev->pdev;
	int err;

	err = pcim_enable_device(pdev);
	if (err)
		return err;
	/* The device writes guest RAM and MSI-X messages: bus mastering. */
	pci_set_master(pdev);
	err = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (err)
		return err;
	dev->bar0 = pcim_iomap(pdev, 0, 0);
	dev->bar2 = pcim_iomap(pdev, 2, 0);
	if (!dev->bar0 || !dev->bar2)
		return -ENOMEM;
	/* A device from before the user access regions has 64 KiB. */
	if (pci_resource_len(pdev, 2) < HCA_BAR2_UAR_OFFSET)
		return -ENODEV;
	return 0;
}

static int hca_query_hw(struct hca_dev *dev)
{
	int err;

	err = hca_cmd(dev, HCA_CMD_QUERY_DEVICE, NULL, 0, &dev->attr,
		      sizeof(dev->attr));
	if (err)
		return err;
	return hca_cmd(dev, HCA_CMD_QUERY_PORT, NULL, 0, &dev->port,
		       sizeof(dev->port));
}

static int hca_register(struct hca_dev *dev)
{
	struct ib_device *ibdev = &dev->ibdev;

	ibdev->node_type = RDMA_NODE_IB_CA;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = HCA_IB_NUM_COMP_VECTORS;
	ibdev->local_dma_lkey = dev->attr.local_dma_lkey;
	ibdev->node_guid = cpu_to_be64(dev->attr.node_guid);
	/* As the fabric's SA describes the node in its NodeRecord. */
	snprintf(ibdev->node_desc, sizeof(ibdev->node_desc),
		 "hcabench HCA, LID %u", dev->port.lid);
	ib_set_device_ops(ibdev, &hca_dev_ops);
	ib_set_device_ops(ibdev, &hca_counter_ops);
	ib_set_device_ops(ibdev, &hca_mad_ops);
	/*
	 * sysfs's /sys/class/infiniband/hcab0/device, and the parent of the
	 * ULPs' netdevs (IPoIB's ib0 under the PCI device's net/), by which
	 * rdma-core's tests and ibdev2netdev pair a device with its interface.
	 */
	ibdev->dev.parent = &dev->pdev->dev;
	return ib_register_device(ibdev, "hcab%d", &dev->pdev->dev);
}

/* INIT and ARMED: the port waits for a subnet manager in a guest. */
static const char *hca_port_state_name(u8 state)
{
	switch (state) {
	case HCA_PORT_INIT:
		return "INIT";
	case HCA_PORT_ARMED:
		return "ARMED";
	case HCA_PORT_ACTIVE:
		return "ACTIVE";
	default:
		return "DOWN";
	}
}

static int hca_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct hca_dev *dev;
	int err;

	dev = ib_alloc_device(hca_dev, ibdev);
	if (!dev)
		return -ENOMEM;
	dev->pdev = pdev;
	mutex_init(&dev->cmd_mutex);
	mutex_init(&dev->qp_mutex);
	mutex_init(&dev->port_mutex);
	mutex_init(&dev->pma_mutex);
	init_completion(&dev->cmd_done);
	spin_lock_init(&dev->table_lock);
	spin_lock_init(&dev->port_lock);
	ida_init(&dev->uar_ida);
	hca_sw_notify_init(dev);
	err = hca_map(dev);
	if (err)
		goto err_free;
	err = hca_identify(dev);
	if (err)
		goto err_free;
	/* A clean function: nothing of an earlier load or a dead device. */
	err = hca_reset(dev);
	if (err)
		goto err_free;
	hca_sq_rings_init(dev);
	dev->user_verbs = (dev->caps & HCA_CAP_UAR) &&
			  pci_resource_len(pdev, 2) >= HCA_BAR2_SIZE &&
			  hca_db_page_private(pdev);
	err = hca_eq_init(dev);
	if (err)
		goto err_free;
	err = hca_query_hw(dev);
	if (err)
		goto err_eq;
	pci_set_drvdata(pdev, dev);
	err = hca_register(dev);
	if (err)
		goto err_eq;
	set_bit(HCA_CATAS_REGISTERED, &dev->catas);
	hca_health_start(dev);
	dev_info(&pdev->dev, "%s: lid %u, port %s, user verbs %s\n",
		 dev_name(&dev->ibdev.dev), ioread16(dev->bar2 + INFO(lid)),
		 hca_port_state_name(ioread8(dev->bar2 + INFO(port_state))),
		 dev->user_verbs ? "on" : "off");
	return 0;

err_eq:
	hca_eq_cleanup(dev);
err_free:
	cancel_work_sync(&dev->sw_notify);
	ida_destroy(&dev->uar_ida);
	ib_dealloc_device(&dev->ibdev);
	return err;
}

static void hca_remove(struct pci_dev *pdev)
{
	struct hca_dev *dev = pci_get_drvdata(pdev);

	/*
	 * Consumers tear down first; their destroy commands need the EQs, and
	 * their drains the health check, should the device be reset meanwhile.
	 */
	ib_unregister_device(&dev->ibdev);
	hca_health_stop(dev);
	/* Nothing is left to flush: no consumer is left to arm a CQ. */
	cancel_work_sync(&dev->sw_notify);
	/*
	 * Processes could write ivshmem's INTx mask and status in the page of
	 * the doorbell register; left asserted, INTx would fire once MSI-X
	 * is gone.
	 */
	iowrite32(0, dev->bar0 + HCA_BAR0_INTR_MASK);
	ioread32(dev->bar0 + HCA_BAR0_INTR_STATUS);
	hca_eq_cleanup(dev);
	ida_destroy(&dev->uar_ida);
	ib_dealloc_device(&dev->ibdev);
}

static const struct pci_device_id hca_ids[] = {
	{ PCI_DEVICE(HCA_PCI_VENDOR_IVSHMEM, HCA_PCI_DEVICE_IVSHMEM) },
	{ PCI_DEVICE(HCA_PCI_VENDOR_HCABENCH, HCA_PCI_DEVICE_HCABENCH) },
	{ }
};
MODULE_DEVICE_TABLE(pci, hca_ids);

static struct pci_driver hca_driver = {
	.name = "hca_ib",
	.id_table = hca_ids,
	.probe = hca_probe,
	.remove = hca_remove,
};
static int __init hca_init(void)
{
	int err = hca_recovery_init();

	if (err)
		return err;
	err = pci_register_driver(&hca_driver);
	if (err)
		hca_recovery_exit();
	return err;
}

static void __exit hca_exit(void)
{
	hca_recovery_stop();
	pci_unregister_driver(&hca_driver);
	hca_recovery_exit();
}

module_init(hca_init);
module_exit(hca_exit);

MODULE_DESCRIPTION("InfiniBand provider for the hcabench emulated HCA");
MODULE_LICENSE("GPL");
