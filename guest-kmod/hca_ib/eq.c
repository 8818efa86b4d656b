// SPDX-License-Identifier: GPL-2.0
/*
 * Event queues and MSI-X. Vector k drains EQ k and nothing else, so each
 * eq_ci[k] has a single writer (its handler, which never runs concurrently
 * with itself) and needs no lock. EQ 0 carries command completions and
 * asynchronous events; EQs 1..3 carry CQ completion events, on which the
 * consumer's completion handler runs here, in hard interrupt context.
 */
#include <linux/interrupt.h>
#include "hca_ib.h"

static const char *const hca_vec_names[HCA_NUM_VECTORS] = {
	"hca_ib-async", "hca_ib-comp0", "hca_ib-comp1", "hca_ib-comp2",
};

static void __iomem *hca_eqe_at(struct hca_dev *dev, int eq, u32 idx)
{
	return dev->bar2 + HCA_BAR2_EQ_OFFSET +
	       eq * HCA_EQ_ENTRIES * sizeof(struct hca_eqe) +
	       (idx & (HCA_EQ_ENTRIES - 1)) * sizeof(struct hca_eqe);
}

static bool hca_eqe_valid(struct hca_dev *dev, int eq, u32 idx)
{
	return ioread8(hca_eqe_at(dev, eq, idx) + HCA_EQE_OWNER_OFFSET) ==
	       hca_owner_bit(idx, HCA_EQ_LOG_ENTRIES);
}

/*
 * Events of CQ cqn. table_lock, held across the consumer's callback, keeps
 * the CQ alive while it runs (destroy_cq unpublishes under it).
 */
static void hca_cq_completion(struct hca_dev *dev, u32 cqn)
{
	struct hca_cq *cq;

	spin_lock(&dev->table_lock);
	cq = cqn < HCA_MAX_CQ ? dev->cqs[cqn] : NULL;
	if (cq && cq->ibcq.comp_handler) {
		/*
		 * This event spent the consumer's arm: if the device is lost
		 * before it arms again, catas.c must not call it a second time.
		 */
		spin_lock(&cq->lock);
		cq->sw_armed = false;
		spin_unlock(&cq->lock);
		cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	}
	spin_unlock(&dev->table_lock);
}

static void hca_cq_error(struct hca_dev *dev, u32 cqn)
{
	struct ib_event ev = { .device = &dev->ibdev, .event = IB_EVENT_CQ_ERR };
	struct hca_cq *cq;

	spin_lock(&dev->table_lock);
	cq = cqn < HCA_MAX_CQ ? dev->cqs[cqn] : NULL;
	if (cq && cq->ibcq.event_handler) {
		ev.element.cq = &cq->ibcq;
		cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
	}
	spin_unlock(&dev->table_lock);
}

static void hca_qp_event(struct hca_dev *dev, u32 qpn, enum ib_event_type type)
{
	struct hca_qp *qp = NULL;
	struct ib_event ev;

	spin_lock(&dev->table_lock);
	if (qpn < HCA_MAX_QP)
		qp = dev->qps[qpn];
	if (qp && qp->ibqp.event_handler) {
		ev.device = &dev->ibdev;
		ev.element.qp = &qp->ibqp;
		ev.event = type;
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	}
	spin_unlock(&dev->table_lock);
}

static void hca_srq_event(struct hca_dev *dev, u32 srqn, enum ib_event_type type)
{
	struct hca_srq *srq;
	struct ib_event ev;

	spin_lock(&dev->table_lock);
	srq = hca_srq_lookup(dev, srqn);
	if (srq && srq->ibsrq.event_handler) {
		ev.device = &dev->ibdev;
		ev.element.srq = &srq->ibsrq;
		ev.event = type;
		srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
	}
	spin_unlock(&dev->table_lock);
}

static void hca_port_event(struct hca_dev *dev, enum ib_event_type type)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.element.port_num = 1,
		.event = type,
	};

	ib_dispatch_event(&ev);
}

static void hca_handle_eqe(struct hca_dev *dev, const struct hca_eqe *e)
{
	switch (e->event_type) {
	case HCA_EV_COMPLETION:
		hca_cq_completion(dev, e->param);
		break;
	case HCA_EV_CMD_DONE:
		hca_cmd_complete(dev, e->param, e->data);
		break;
	case HCA_EV_PORT_ACTIVE:
		hca_port_event(dev, IB_EVENT_PORT_ACTIVE);
		break;
	case HCA_EV_PORT_DOWN:
		hca_port_event(dev, IB_EVENT_PORT_ERR);
		break;
	case HCA_EV_CQ_ERR:
		dev_warn_ratelimited(&dev->pdev->dev, "CQ %u error %u\n",
				     e->param, e->data);
		hca_cq_error(dev, e->param);
		break;
	case HCA_EV_QP_FATAL:
		hca_qp_event(dev, e->param, IB_EVENT_QP_FATAL);
		break;
	case HCA_EV_QP_ACCESS_ERR:
		hca_qp_event(dev, e->param, IB_EVENT_QP_ACCESS_ERR);
		break;
	case HCA_EV_QP_LAST_WQE:
		hca_qp_event(dev, e->param, IB_EVENT_QP_LAST_WQE_REACHED);
		break;
	case HCA_EV_SRQ_LIMIT:
		hca_srq_event(dev, e->param, IB_EVENT_SRQ_LIMIT_REACHED);
		break;
	case HCA_EV_SRQ_ERR:
		dev_warn_ratelimited(&dev->pdev->dev, "SRQ %u error %u\n",
				     e->param, e->data);
		hca_srq_event(dev, e->param, IB_EVENT_SRQ_ERR);
		break;
	case HCA_EV_CATAS:
		hca_catastrophic(dev, e->param);
		break;
	case HCA_EV_PORT_CHANGE:
		/* ib_core, ib_sa and IPoIB read the port again for each. */
		if (e->data & HCA_PORT_CHANGE_LID)
			hca_port_event(dev, IB_EVENT_LID_CHANGE);
		if (e->data & HCA_PORT_CHANGE_SM)
			hca_port_event(dev, IB_EVENT_SM_CHANGE);
		if (e->data & HCA_PORT_CHANGE_REREG)
			hca_port_event(dev, IB_EVENT_CLIENT_REREGISTER);
		break;
	case HCA_EV_PKEY_CHANGE:
		/* ib_core reads the table again; IPoIB's children follow it. */
		hca_port_event(dev, IB_EVENT_PKEY_CHANGE);
		break;
	default:
		dev_warn_ratelimited(&dev->pdev->dev, "unknown event %u\n",
				     e->event_type);
	}
}

/* Returns how many entries it consumed. */
static int hca_eq_drain(struct hca_dev *dev, int eq)
{
	struct hca_eqe e;
	u32 ci = dev->eq_ci[eq];
	int n = 0;

	while (hca_eqe_valid(dev, eq, ci)) {
		/* Read the entry only after its owner byte says it is whole. */
		dma_rmb();
		memcpy_fromio(&e, hca_eqe_at(dev, eq, ci), sizeof(e));
		/*
		 * Consumed before its handler runs: the device gives a CQ no
		 * second event while its last one is unconsumed, and a handler
		 * that re-arms its CQ must be able to get the next one.
		 */
		ci++;
		iowrite32(ci, dev->bar2 + HCA_BAR2_EQ_DB_OFFSET +
			  eq * HCA_EQ_DB_STRIDE);
		hca_handle_eqe(dev, &e);
		n++;
	}
	dev->eq_ci[eq] = ci;
	return n;
}

static irqreturn_t hca_irq(int irq, void *data)
{
	struct hca_dev *dev = data;
	int eq;

	for (eq = 0; eq < HCA_NUM_VECTORS; eq++)
		if (dev->irq[eq] == irq)
			break;
	if (eq == HCA_NUM_VECTORS)
		return IRQ_NONE;
	return hca_eq_drain(dev, eq) ? IRQ_HANDLED : IRQ_NONE;
}

static void hca_eq_skip_stale(struct hca_dev *dev, int eq)
{
	void __iomem *db = dev->bar2 + HCA_BAR2_EQ_DB_OFFSET + eq * HCA_EQ_DB_STRIDE;
	u32 ci = ioread32(db), n = 0;

	/*
	 * An earlier load of this driver left its consumer index in BAR2;
	 * whatever came after it is old news too.
	 */
	while (hca_eqe_valid(dev, eq, ci) && n++ < HCA_EQ_ENTRIES)
		ci++;
	dev->eq_ci[eq] = ci;
	iowrite32(ci, db);
}

int hca_eq_init(struct hca_dev *dev)
{
	struct pci_dev *pdev = dev->pdev;
	int err, i;

	err = pci_alloc_irq_vectors(pdev, HCA_NUM_VECTORS, HCA_NUM_VECTORS,
				    PCI_IRQ_MSIX);
	if (err < 0)
		return err;
	for (i = 0; i < HCA_NUM_VECTORS; i++)
		dev->irq[i] = pci_irq_vector(pdev, i);
	for (i = 0; i < HCA_NUM_VECTORS; i++) {
		hca_eq_skip_stale(dev, i);
		err = request_irq(dev->irq[i], hca_irq, 0, hca_vec_names[i], dev);
		if (err)
			goto err_irqs;
	}
	return 0;

err_irqs:
	while (--i >= 0)
		free_irq(dev->irq[i], dev);
	pci_free_irq_vectors(pdev);
	return err;
}

void hca_eq_cleanup(struct hca_dev *dev)
{
	int i;

	for (i = 0; i < HCA_NUM_VECTORS; i++)
		free_irq(dev->irq[i], dev);
	pci_free_irq_vectors(dev->pdev);
}
