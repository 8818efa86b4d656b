// SPDX-License-Identifier: GPL-2.0
/*
 * The port's Subnet Management Agent, as an HCA's firmware runs one: it
 * answers Gets of NodeDescription, NodeInfo, GUIDInfo, PortInfo and
 * P_KeyTable, LID-routed (from QP0 on the wire: another node's smpquery)
 * or directed-route (this node's own tools, through ib_mad's local path).
 *
 * Sets of PortInfo and P_KeyTable, which a subnet manager in a guest makes
 * (OpenSM: sm = "guest"), go to the device (SMP_SET), which checks the M_Key
 * and every field and changes the port; the answer is the attribute as it
 * is then. The fabric's own SM configures ports itself: while it manages
 * the subnet a Set is answered "unsupported" and changes nothing.
 * An SMP whose M_Key the port's protection refuses gets no answer.
 */
#include <rdma/ib_mad.h>
#include <rdma/ib_smi.h>
#include "hca_ib.h"

#define SMA_LINK_WIDTH_SUPPORTED	(IB_WIDTH_1X | IB_WIDTH_4X)
/* LinkSpeedSupported/Enabled: SDR, DDR and QDR (IBA 14.2.5.6). */
#define SMA_LINK_SPEEDS			0x7
#define SMA_LINK_SPEED_QDR		0x4
/* LinkDownDefaultState: Polling. */
#define SMA_LINK_DOWN_DEFAULT		0x2
/* One data VL (VL0): VLCap and OperationalVLs. */
#define SMA_VL0_ONLY			0x1
/* 4.096 us * 2^18, about 1 s, as the SA and the PMA say. */
#define SMA_RESP_TIME_VALUE		18

static u16 sma_node_info(struct hca_dev *dev, u32 port, void *data)
{
	struct ib_node_info *ni = data;
	u32 vendor = HCA_PCI_VENDOR_HCABENCH;

	ni->base_version = IB_MGMT_BASE_VERSION;
	ni->class_version = 1;
	ni->node_type = RDMA_NODE_IB_CA;
	ni->num_ports = dev->ibdev.phys_port_cnt;
	ni->sys_guid = dev->ibdev.node_guid;
	ni->node_guid = dev->ibdev.node_guid;
	ni->port_guid = cpu_to_be64(dev->port.port_guid);
	ni->partition_cap = cpu_to_be16(HCA_PKEY_TABLE_LEN);
	ni->device_id = cpu_to_be16(HCA_PCI_DEVICE_HCABENCH);
	ni->revision = cpu_to_be32(dev->attr.fw_ver);
	ni->local_port_num = port;
	ni->vendor_id[0] = vendor >> 16;
	ni->vendor_id[1] = vendor >> 8;
	ni->vendor_id[2] = vendor;
	return 0;
}

/*
 * Whether the port's M_Key protection hides it from an SMP carrying @mkey
 * (IBA 14.2.4.1): with the key set and protection 2 or 3, only an SMP with
 * the key gets an answer.
 */
static bool sma_mkey_refused(struct hca_dev *dev, __be64 mkey)
{
	unsigned long flags;
	bool refused;

	spin_lock_irqsave(&dev->port_lock, flags);
	refused = dev->port.mkey && dev->port.mkey_prot >= 2 &&
		  be64_to_cpu(mkey) != dev->port.mkey;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	return refused;
}

static u16 sma_port_info(struct hca_dev *dev, u32 port, u32 attr_mod,
			 void *data, __be64 smp_mkey)
{
	struct ib_port_info *pi = data;
	struct hca_port_attr set;
	struct ib_port_attr a;
	unsigned long flags;

	/* A CA's ports are named from 1; 0 is the port the SMP came in on. */
	if (attr_mod && attr_mod != port)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	if (ib_query_port(&dev->ibdev, port, &a))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	spin_lock_irqsave(&dev->port_lock, flags);
	set = dev->port;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	/* Protection 0 shows the M_Key; 1 shows it only to an SMP with it. */
	if (!set.mkey_prot || be64_to_cpu(smp_mkey) == set.mkey)
		pi->mkey = cpu_to_be64(set.mkey);
	pi->mkey_lease_period = cpu_to_be16(set.mkey_lease);
	pi->gid_prefix = cpu_to_be64(set.gid_prefix);
	pi->lid = cpu_to_be16(a.lid);
	pi->sm_lid = cpu_to_be16(a.sm_lid);
	pi->cap_mask = cpu_to_be32(a.port_cap_flags);
	pi->local_port_num = port;
	pi->link_width_enabled = a.active_width;
	pi->link_width_supported = SMA_LINK_WIDTH_SUPPORTED;
	pi->link_width_active = a.active_width;
	pi->linkspeed_portstate = SMA_LINK_SPEEDS << 4 | a.state;
	pi->portphysstate_linkdown = a.phys_state << 4 | SMA_LINK_DOWN_DEFAULT;
	pi->mkeyprot_resv_lmc = set.mkey_prot << 6 | (a.lmc & 0x7);
	pi->linkspeedactive_enabled = SMA_LINK_SPEED_QDR << 4 | SMA_LINK_SPEEDS;
	pi->neighbormtu_mastersmsl = a.active_mtu << 4 | (a.sm_sl & 0xf);
	pi->vlcap_inittype = SMA_VL0_ONLY << 4;
	pi->inittypereply_mtucap = a.max_mtu & 0xf;
	pi->operationalvl_pei_peo_fpi_fpo = SMA_VL0_ONLY << 4;
	pi->pkey_violations = cpu_to_be16(a.bad_pkey_cntr);
	pi->qkey_violations = cpu_to_be16(a.qkey_viol_cntr);
	pi->guid_cap = a.gid_tbl_len;
	pi->clientrereg_resv_subnetto = a.subnet_timeout & 0x1f;
	pi->resv_resptimevalue = SMA_RESP_TIME_VALUE;
	return 0;
}

/*
 * GUIDInfo: eight GUIDs a block, as many as the GID table (GUIDCap); the
 * port has one, its port GUID, and no alias GUIDs.
 */
static u16 sma_guid_info(struct hca_dev *dev, u32 attr_mod, void *data)
{
	__be64 *guids = data;

	if (attr_mod)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	guids[0] = cpu_to_be64(dev->port.port_guid);
	return 0;
}

/* P_KeyTable: 32 entries a block; the table (16 entries) fits block 0. */
static u16 sma_pkey_table(struct hca_dev *dev, u32 attr_mod, void *data)
{
	struct hca_pkey_table t;
	__be16 *pkeys = data;
	int i;

	if (attr_mod & 0xffff)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	if (hca_cmd(dev, HCA_CMD_QUERY_PKEYS, NULL, 0, &t, sizeof(t)))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	for (i = 0; i < HCA_PKEY_TABLE_LEN; i++)
		pkeys[i] = cpu_to_be16(t.pkeys[i]);
	return 0;
}

/*
 * Only a subnet manager in a guest sets the port; while the fabric is the SM
 * no SMP changes it, so no node can change another's port.
 */
static bool sma_takes_sets(struct hca_dev *dev)
{
	unsigned long flags;
	bool takes;

	spin_lock_irqsave(&dev->port_lock, flags);
	takes = dev->port.flags & HCA_PORT_FLAG_GUEST_SM;
	spin_unlock_irqrestore(&dev->port_lock, flags);
	return takes;
}

/*
 * A subnet manager's Set of PortInfo or P_KeyTable, made by the device;
 * -EACCES when the SMP's M_Key does not match the port's.
 */
static int sma_set(struct hca_dev *dev, const struct ib_smp *smp)
{
	struct hca_cmd_smp_set in = {
		.attr_id = be16_to_cpu(smp->attr_id),
		.attr_mod = be32_to_cpu(smp->attr_mod),
		.mkey = be64_to_cpu(smp->mkey),
	};

	BUILD_BUG_ON(sizeof(in.data) > sizeof(smp->data));
	memcpy(in.data, smp->data, sizeof(in.data));
	return hca_cmd(dev, HCA_CMD_SMP_SET, &in, sizeof(in), NULL, 0);
}

/*
 * Answers an SMP Get or Set in *out (a copy of *in); SUCCESS alone for what
 * is not the agent's (responses to this node's own queries, traps), which
 * ib_mad then hands to its agents, or that the port's M_Key refuses.
 */
int hca_sma_process(struct hca_dev *dev, u32 port, const struct ib_mad *in,
		    struct ib_mad *out)
{
	const struct ib_smp *smp = (const struct ib_smp *)in;
	struct ib_smp *resp = (struct ib_smp *)out;
	u32 attr_mod = be32_to_cpu(smp->attr_mod);
	u16 status = 0;

	bool set = smp->method == IB_MGMT_METHOD_SET;
	int err;

	if (smp->method != IB_MGMT_METHOD_GET && !set)
		return IB_MAD_RESULT_SUCCESS;
	/*
	 * Under a guest's SM, SMInfo is that SM's (OpenSM's agent on this
	 * port), if any; ib_mad answers "unsupported" where none listens.
	 */
	if (smp->attr_id == IB_SMP_ATTR_SM_INFO && sma_takes_sets(dev))
		return IB_MAD_RESULT_SUCCESS;
	/* Refused by the M_Key: dropped here, seen by no agent. */
	if (sma_mkey_refused(dev, smp->mkey))
		return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_CONSUMED;
	memcpy(out, in, sizeof(*out));
	resp->method = IB_MGMT_METHOD_GET_RESP;
	memset(resp->data, 0, sizeof(resp->data));
	if (smp->class_version != 1) {
		status = IB_MGMT_MAD_STATUS_BAD_VERSION;
	} else if (set && sma_takes_sets(dev) &&
		   (smp->attr_id == IB_SMP_ATTR_PORT_INFO ||
		    smp->attr_id == IB_SMP_ATTR_PKEY_TABLE)) {
		err = sma_set(dev, smp);
		if (err == -EACCES)
			return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_CONSUMED;
		if (err)
			status = IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	} else if (set) {
		status = IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB;
	}
	/* A Set is answered with the attribute as it is now. */
	if (status)
		;
	else if (smp->attr_id == IB_SMP_ATTR_NODE_DESC)
		memcpy(resp->data, dev->ibdev.node_desc, IB_DEVICE_NODE_DESC_MAX);
	else if (smp->attr_id == IB_SMP_ATTR_NODE_INFO)
		status = sma_node_info(dev, port, resp->data);
	else if (smp->attr_id == IB_SMP_ATTR_GUID_INFO)
		status = sma_guid_info(dev, attr_mod, resp->data);
	else if (smp->attr_id == IB_SMP_ATTR_PORT_INFO)
		status = sma_port_info(dev, port, attr_mod, resp->data,
				       smp->mkey);
	else if (smp->attr_id == IB_SMP_ATTR_PKEY_TABLE)
		status = sma_pkey_table(dev, attr_mod, resp->data);
	else
		status = IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB;
	/* ib_mad's SMI turns the route round; the D bit says it is a reply. */
	resp->status = cpu_to_be16(status);
	if (smp->mgmt_class == IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE)
		resp->status |= IB_SMP_DIRECTION;
	return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
}
