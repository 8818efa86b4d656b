// SPDX-License-Identifier: GPL-2.0
/*
 * Device and port queries, PDs, address handles and memory regions, and
 * the ops table ib_core calls through.
 */
#include <rdma/ib_mad.h>
#include "hca_ib.h"

#define INFO(field) offsetof(struct hca_dev_info, field)

static int hca_query_device(struct ib_device *ibdev, struct ib_device_attr *a,
			    struct ib_udata *uhw)
{
	struct hca_dev *dev = to_hdev(ibdev);
	const struct hca_device_attr *h = &dev->attr;

	memset(a, 0, sizeof(*a));
	a->fw_ver = h->fw_ver;
	a->sys_image_guid = cpu_to_be64(h->node_guid);
	a->max_mr_size = h->max_mr_size;
	a->page_size_cap = h->page_size_cap;
	a->vendor_id = HCA_PCI_VENDOR_HCABENCH;
	a->vendor_part_id = HCA_PCI_DEVICE_HCABENCH;
	a->max_qp = h->max_qp;
	/*
	 * A ring is one contiguous allocation of at most HCA_IB_MAX_USER_RING:
	 * any QP or SRQ within the limits said here can be made, whatever its
	 * SGEs and inline size (rdma-core's tests pick them at random).
	 */
	a->max_qp_wr = min_t(u32, h->max_qp_wr,
			     HCA_IB_MAX_USER_RING >> HCA_MAX_SQ_WQE_SHIFT);
	a->max_send_sge = h->max_sge;
	a->max_recv_sge = h->max_sge;
	a->max_sge_rd = h->max_sge;
	a->max_cq = h->max_cq;
	a->max_cqe = h->max_cqe;
	a->max_mr = h->max_mr;
	a->max_pd = h->max_pd;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->max_res_rd_atom = 16 * h->max_qp;
	a->atomic_cap = IB_ATOMIC_HCA;
	/* RDS posts every atomic as a masked one. */
	if (dev->caps & HCA_CAP_MASKED_ATOMIC)
		a->masked_atomic_cap = IB_ATOMIC_HCA;
	a->max_ah = INT_MAX;
	a->max_pkeys = HCA_PKEY_TABLE_LEN;
	a->local_ca_ack_delay = 15;
	a->kernel_cap_flags = IBK_LOCAL_DMA_LKEY;
	a->device_cap_flags = IB_DEVICE_MEM_MGT_EXTENSIONS;
	/* Windows share the MR table: each takes an MR's slot. */
	if (dev->caps & HCA_CAP_MW_UC) {
		a->device_cap_flags |= IB_DEVICE_MEM_WINDOW |
				       IB_DEVICE_MEM_WINDOW_TYPE_2B;
		a->max_mw = h->max_mr;
	}
	/* The device runs ATOMIC WRITE (IBTA 1.5) wherever it runs atomics. */
	if (dev->caps & HCA_CAP_ATOMIC)
		a->device_cap_flags |= HCAB_DEVICE_ATOMIC_WRITE;
	a->max_fast_reg_page_list_len = HCA_IB_MAX_FRMR_PAGES;
	if (dev->caps & HCA_CAP_SRQ) {
		a->max_srq = HCA_MAX_SRQ - 1;
		a->max_srq_wr = min_t(u32, 1 << HCA_MAX_SRQ_LOG_WR,
				      HCA_IB_MAX_USER_RING >>
				      HCA_MAX_RQ_WQE_SHIFT);
		a->max_srq_sge = h->max_sge;
	}
	a->max_mcast_grp = HCA_MAX_MCAST_ATTACH;
	a->max_mcast_qp_attach = HCA_MAX_MCAST_ATTACH;
	a->max_total_mcast_qp_attach = HCA_MAX_MCAST_ATTACH;
	return 0;
}

static int hca_query_port(struct ib_device *ibdev, u32 port,
			  struct ib_port_attr *a)
{
	struct hca_dev *dev = to_hdev(ibdev);
	struct hca_port_attr now;
	unsigned long flags;
	u8 state;

	/*
	 * What a subnet manager in a guest sets (its LID and SL, the timeout,
	 * the M_Key) changes under us: read it again (a dead device keeps what
	 * it had). Under the fabric's own SM none of it changes.
	 */
	if (READ_ONCE(dev->port.flags) & HCA_PORT_FLAG_GUEST_SM &&
	    !hca_cmd(dev, HCA_CMD_QUERY_PORT, NULL, 0, &now, sizeof(now))) {
		spin_lock_irqsave(&dev->port_lock, flags);
		dev->port.sm_lid = now.sm_lid;
		dev->port.sm_sl = now.sm_sl;
		dev->port.subnet_timeout = now.subnet_timeout;
		dev->port.mkey = now.mkey;
		dev->port.mkey_prot = now.mkey_prot;
		dev->port.mkey_lease = now.mkey_lease;
		spin_unlock_irqrestore(&dev->port_lock, flags);
	}
	/* ib_core zeroed *a. State and LID are live in BAR2. */
	state = ioread8(dev->bar2 + INFO(port_state));
	switch (state) {
	case HCA_PORT_INIT:
		a->state = IB_PORT_INIT;
		break;
	case HCA_PORT_ARMED:
		a->state = IB_PORT_ARMED;
		break;
	case HCA_PORT_ACTIVE:
		a->state = IB_PORT_ACTIVE;
		break;
	default:
		a->state = IB_PORT_DOWN;
	}
	a->phys_state = a->state == IB_PORT_DOWN ?
			IB_PORT_PHYS_STATE_DISABLED : IB_PORT_PHYS_STATE_LINK_UP;
	a->lid = ioread16(dev->bar2 + INFO(lid));
	spin_lock_irqsave(&dev->port_lock, flags);
	a->sm_lid = dev->port.sm_lid;
	a->sm_sl = dev->port.sm_sl;
	a->subnet_timeout = dev->port.subnet_timeout;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	a->max_mtu = dev->port.max_mtu;
	a->active_mtu = dev->port.active_mtu;
	a->gid_tbl_len = HCA_IB_GID_TABLE_LEN;
	a->pkey_tbl_len = HCA_PKEY_TABLE_LEN;
	spin_lock_irqsave(&dev->port_lock, flags);
	a->port_cap_flags = dev->port_cap_flags;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	a->max_msg_sz = HCA_MAX_MSG_SIZE;
	a->max_vl_num = 1;
	a->active_width = IB_WIDTH_4X;
	a->active_speed = IB_SPEED_QDR;	/* 4x QDR, 40 Gb/s, as the SA says */
	return 0;
}

/*
 * Capability bits are the port's to advertise: the device hears them
 * (SET_PORT_CAP) and the SA's PortInfoRecord shows them. A port cannot be
 * shut down from here, and there is no Q_Key violation counter to reset.
 */
static int hca_modify_port(struct ib_device *ibdev, u32 port, int mask,
			   struct ib_port_modify *props)
{
	struct hca_dev *dev = to_hdev(ibdev);
	struct hca_cmd_port_cap in = {};
	unsigned long flags;
	u32 old;
	int err;

	if (mask & ~IB_PORT_RESET_QKEY_CNTR)
		return -EOPNOTSUPP;
	mutex_lock(&dev->port_mutex);
	spin_lock_irqsave(&dev->port_lock, flags);
	old = dev->port_cap_flags;
	in.cap_mask = (old | props->set_port_cap_mask) &
		      ~props->clr_port_cap_mask;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	err = hca_cmd(dev, HCA_CMD_SET_PORT_CAP, &in, sizeof(in), NULL, 0);
	if (!err) {
		spin_lock_irqsave(&dev->port_lock, flags);
		dev->port_cap_flags = in.cap_mask;
		spin_unlock_irqrestore(&dev->port_lock, flags);
	}
	mutex_unlock(&dev->port_mutex);
	return err;
}

static int hca_get_port_immutable(struct ib_device *ibdev, u32 port,
				  struct ib_port_immutable *im)
{
	struct ib_port_attr a;
	int err;

	err = ib_query_port(ibdev, port, &a);
	if (err)
		return err;
	im->pkey_tbl_len = a.pkey_tbl_len;
	im->gid_tbl_len = a.gid_tbl_len;
	/*
	 * IB with QP0: the fabric is the subnet manager and sends no SMPs, but
	 * the port's agent (sma.c) answers other nodes' and this node's own
	 * (smpquery, perfquery open the SMI class).
	 */
	im->core_cap_flags = RDMA_CORE_PORT_IBA_IB;
	im->max_mad_size = IB_MGMT_MAD_SIZE;
	return 0;
}

static enum rdma_link_layer hca_get_link_layer(struct ib_device *ibdev, u32 port)
{
	return IB_LINK_LAYER_INFINIBAND;
}

static int hca_query_gid(struct ib_device *ibdev, u32 port, int index,
			 union ib_gid *gid)
{
	struct hca_dev *dev = to_hdev(ibdev);

	if (index < 0 || index >= HCA_IB_GID_TABLE_LEN)
		return -EINVAL;
	/* The alias GUIDs' entries: unassigned, as the SM leaves them. */
	if (index) {
		memset(gid, 0, sizeof(*gid));
		return 0;
	}
	gid->global.subnet_prefix = cpu_to_be64(dev->port.gid_prefix);
	gid->global.interface_id = cpu_to_be64(dev->port.port_guid);
	return 0;
}

/* The table is the subnet manager's (the fabric's): asked of the device each time. */
static int hca_query_pkey(struct ib_device *ibdev, u32 port, u16 index, u16 *pkey)
{
	struct hca_pkey_table t;
	int err;

	if (index >= HCA_PKEY_TABLE_LEN)
		return -EINVAL;
	err = hca_cmd(to_hdev(ibdev), HCA_CMD_QUERY_PKEYS, NULL, 0, &t, sizeof(t));
	if (err)
		return err;
	*pkey = t.pkeys[index];
	return 0;
}

static int hca_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	/* A process's PD reaches only what its MRs map (HCA_PD_FLAG_USER). */
	struct hca_cmd_alloc_pd in = { .flags = udata ? HCA_PD_FLAG_USER : 0 };
	struct hca_cmd_handle out;
	int err;

	err = hca_cmd(to_hdev(ibpd->device), HCA_CMD_ALLOC_PD, &in, sizeof(in),
		      &out, sizeof(out));
	if (err)
		return err;
	to_hpd(ibpd)->pdn = out.handle;
	return 0;
}

static int hca_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	return hca_cmd_handle(to_hdev(ibpd->device), HCA_CMD_DEALLOC_PD,
			      to_hpd(ibpd)->pdn);
}

/*
 * Address handles live in the driver only: a UD WQE carries the DLID, and the
 * device adds the GRH a multicast LID needs. The permissive LID is for
 * directed-route SMPs: ib_mad answers a route that ends at this port itself
 * (through process_mad); one that leaves it goes to the fabric's switch.
 */
static int hca_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
			 struct ib_udata *udata)
{
	/*
	 * LID 0 is taken, as hardware takes it: ib_sa makes its SM AH from the
	 * port's SM LID, which is 0 until a subnet manager in a guest sets it;
	 * what is sent there reaches no port.
	 */
	to_hah(ibah)->dlid = rdma_ah_get_dlid(init->ah_attr);
	return 0;
}

static int hca_query_ah(struct ib_ah *ibah, struct rdma_ah_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	attr->type = RDMA_AH_ATTR_TYPE_IB;
	rdma_ah_set_dlid(attr, to_hah(ibah)->dlid);
	rdma_ah_set_port_num(attr, 1);
	return 0;
}

static int hca_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	return 0;
}

static int hca_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid, u32 op)
{
	struct hca_cmd_mcast in = {
		.qpn = to_hqp(ibqp)->qpn,
		.mlid = lid,
	};

	memcpy(in.mgid, gid->raw, sizeof(in.mgid));
	return hca_cmd(to_hdev(ibqp->device), op, &in, sizeof(in), NULL, 0);
}

static int hca_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return hca_mcast(ibqp, gid, lid, HCA_CMD_ATTACH_MCAST);
}

static int hca_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return hca_mcast(ibqp, gid, lid, HCA_CMD_DETACH_MCAST);
}

const struct ib_device_ops hca_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = HCA_UVERBS_ABI_VERSION,
	.alloc_ucontext = hca_alloc_ucontext,
	.dealloc_ucontext = hca_dealloc_ucontext,
	.disassociate_ucontext = hca_disassociate_ucontext,
	.mmap = hca_mmap,
	.mmap_free = hca_mmap_free,
	.query_device = hca_query_device,
	.query_port = hca_query_port,
	.modify_port = hca_modify_port,
	.get_port_immutable = hca_get_port_immutable,
	.get_link_layer = hca_get_link_layer,
	.query_gid = hca_query_gid,
	.query_pkey = hca_query_pkey,
	.alloc_pd = hca_alloc_pd,
	.dealloc_pd = hca_dealloc_pd,
	.create_ah = hca_create_ah,
	.query_ah = hca_query_ah,
	.destroy_ah = hca_destroy_ah,
	.get_dma_mr = hca_get_dma_mr,
	.reg_user_mr = hca_reg_user_mr,
	.alloc_mr = hca_alloc_mr,
	.map_mr_sg = hca_map_mr_sg,
	.dereg_mr = hca_dereg_mr,
	.alloc_mw = hca_alloc_mw,
	.dealloc_mw = hca_dealloc_mw,
	.create_cq = hca_create_cq,
	.destroy_cq = hca_destroy_cq,
	.resize_cq = hca_resize_cq,
	.poll_cq = hca_poll_cq,
	.req_notify_cq = hca_req_notify_cq,
	.create_qp = hca_create_qp,
	.modify_qp = hca_modify_qp,
	.query_qp = hca_query_qp,
	.destroy_qp = hca_destroy_qp,
	.post_send = hca_post_send,
	.post_recv = hca_post_recv,
	.create_srq = hca_create_srq,
	.modify_srq = hca_modify_srq,
	.query_srq = hca_query_srq,
	.destroy_srq = hca_destroy_srq,
	.post_srq_recv = hca_post_srq_recv,
	.attach_mcast = hca_attach_mcast,
	.detach_mcast = hca_detach_mcast,
	INIT_RDMA_OBJ_SIZE(ib_pd, hca_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_mw, hca_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_ah, hca_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, hca_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_qp, hca_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, hca_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, hca_ucontext, ibuc),
};
