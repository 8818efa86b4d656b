/* SPDX-License-Identifier: (GPL-2.0 OR Apache-2.0) */
/*
 * Guest-visible ABI of the hcabench HCA.
 *
 * The C twin of hca-model/src/abi.rs; docs/hca-abi.md is the prose.
 * hca-model/tests/abi_c.rs compiles this header and checks every
 * constant, struct size, field offset and field width against Rust.
 *
 * All fields are little-endian. imm fields are opaque 32-bit values
 * carried end to end (ib_core keeps immediate data big-endian).
 * Enumerations reuse ib_core's numbering where it has one (QP state and
 * type, WC status and opcode, access flags, modify-QP attribute mask).
 */
#ifndef HCA_ABI_H
#define HCA_ABI_H

#include <linux/types.h>

#define HCA_ABI_VERSION			1
#define HCA_SIGNATURE			0x42414348	/* "HCAB" */

/* PCI identity */
#define HCA_PCI_VENDOR_IVSHMEM		0x1af4
#define HCA_PCI_DEVICE_IVSHMEM		0x1110
#define HCA_PCI_VENDOR_HCABENCH		0x1234
#define HCA_PCI_DEVICE_HCABENCH		0x21a8

/* BAR0: ivshmem register layout */
#define HCA_BAR0_INTR_MASK		0x00
#define HCA_BAR0_INTR_STATUS		0x04
#define HCA_BAR0_IV_POSITION		0x08
#define HCA_BAR0_DOORBELL		0x0c
#define HCA_DOORBELL_PEER_SHIFT		16

/* Doorbell classes: the vector field of a BAR0 doorbell write */
#define HCA_DB_CMD			0
#define HCA_DB_SQ			1
#define HCA_DB_RQ			2
#define HCA_DB_CQ_ARM			3
#define HCA_NUM_VECTORS			4

/* MSI-X vectors */
#define HCA_VEC_ASYNC			0
#define HCA_VEC_COMP_FIRST		1

/* BAR2 layout */
#define HCA_BAR2_SIZE			0x80000
#define HCA_BAR2_INFO_OFFSET		0x0000
#define HCA_BAR2_MAILBOX_OFFSET		0x1000
#define HCA_BAR2_EQ_DB_OFFSET		0x2000
#define HCA_EQ_DB_STRIDE		16
#define HCA_BAR2_EQ_OFFSET		0x3000
#define HCA_EQ_LOG_ENTRIES		8
#define HCA_EQ_ENTRIES			(1 << HCA_EQ_LOG_ENTRIES)
#define HCA_BAR2_QP_DB_OFFSET		0x8000
#define HCA_BAR2_CQ_DB_OFFSET		0xa000
#define HCA_BAR2_SRQ_DB_OFFSET		0xb000
/*
 * Send-doorbell rings (with HCA_CAP_SQ_RING): before ringing HCA_DB_SQ for
 * a QP created with HCA_QP_FLAG_SQ_RING, the driver appends its QPN to one
 * ring (a single writer per ring: its CPU's), so that the device runs that
 * send queue instead of looking at every QP. In a ring: the writer's
 * free-running producer index (u32) at HCA_SQ_RING_PI, written after the
 * QPN it publishes; the QPN of index i at HCA_SQ_RING_QPN_OFFSET +
 * 4 * (i % HCA_SQ_RING_ENTRIES). The device keeps its consumer index to
 * itself; a writer HCA_SQ_RING_ENTRIES or more ahead of it costs one
 * look at every QP, nothing is lost. A process's ring is in its UAR page
 * (HCA_UAR_SQ_RING_OFFSET, hca_uapi.h).
 */
#define HCA_BAR2_SQ_RING_OFFSET		0xc000
#define HCA_SQ_RING_STRIDE		0x200
#define HCA_SQ_RINGS			32
#define HCA_SQ_RING_PI			0x00
/*
 * in the kernel's ring 0 alone: how many rings, from ring 0, the driver
 * writes (the device reads those only); 0: all HCA_SQ_RINGS
 */
#define HCA_SQ_RINGS_USED		0x04
#define HCA_SQ_RING_QPN_OFFSET		0x40
#define HCA_SQ_RING_ENTRIES		64
/*
 * User access regions: one page per user context, holding the doorbell
 * records of its QPs, CQs and SRQs (db_offset at creation).
 */
#define HCA_BAR2_UAR_OFFSET		0x10000
#define HCA_UAR_SIZE			0x1000
#define HCA_MAX_UAR			((HCA_BAR2_SIZE - HCA_BAR2_UAR_OFFSET) / HCA_UAR_SIZE)

/* Device limits */
#define HCA_MAX_QP			1024
#define HCA_MAX_CQ			256
/* SRQN 0 is never handed out */
#define HCA_MAX_SRQ			256
#define HCA_MAX_SRQ_LOG_WR		14
#define HCA_MAX_PD			1024
#define HCA_MAX_MR			4096
#define HCA_MAX_QP_LOG_WR		14
#define HCA_MAX_CQ_LOG_CQE		16
#define HCA_MAX_SGE			16
#define HCA_MAX_INLINE			512
#define HCA_MIN_SQ_WQE_SHIFT		6
#define HCA_MAX_SQ_WQE_SHIFT		10
#define HCA_MIN_RQ_WQE_SHIFT		4
#define HCA_MAX_RQ_WQE_SHIFT		9
#define HCA_MAX_MR_PAGES		(1 << 20)
#define HCA_MAX_TOTAL_MR_PAGES		(1 << 22)
#define HCA_MIN_MR_PAGE_SHIFT		12
#define HCA_MAX_MR_PAGE_SHIFT		30
#define HCA_MAX_MSG_SIZE		(1U << 31)
#define HCA_LOCAL_DMA_LKEY		0x00000001
#define HCA_UD_GRH_BYTES		40
#define HCA_MCAST_LID_FIRST		0xc000
#define HCA_MAX_MCAST_ATTACH		1024
#define HCA_GSI_QPN			1
#define HCA_GSI_QKEY			0x80010000
/* QP0: takes only what another port's QP0 sent, whatever its P_Key or Q_Key */
#define HCA_SMI_QPN			0

/* hca_dev_info.caps */
#define HCA_CAP_RC			(1 << 0)
#define HCA_CAP_UD			(1 << 1)
#define HCA_CAP_RDMA_READ		(1 << 2)
#define HCA_CAP_ATOMIC			(1 << 3)
#define HCA_CAP_LOCAL_DMA_LKEY		(1 << 4)
#define HCA_CAP_MASKED_ATOMIC		(1 << 5)
#define HCA_CAP_SRQ			(1 << 6)
/* db_offset in CREATE_CQ/QP/SRQ, HCA_PD_FLAG_USER */
#define HCA_CAP_UAR			(1 << 7)
/* send-doorbell rings and HCA_QP_FLAG_SQ_RING */
#define HCA_CAP_SQ_RING			(1 << 8)
/* memory windows (ALLOC_MW, DEALLOC_MW, HCA_WR_BIND_MW) and UC QPs */
#define HCA_CAP_MW_UC			(1 << 9)
/* EV_CATAS, catas_syndrome, CMD_RESET and CMD_FATAL */
#define HCA_CAP_RESET			(1 << 10)

/* Port (ib_port_state, ib_mtu numbering) */
#define HCA_PORT_DOWN			1
/* link up, waiting for a subnet manager: only SMPs pass */
#define HCA_PORT_INIT			2
#define HCA_PORT_ARMED			3
/* hca_port_attr.flags: an SM in a guest manages the port (it takes SMP_SET) */
#define HCA_PORT_FLAG_GUEST_SM		(1 << 0)
#define HCA_PORT_ACTIVE			4
#define HCA_MTU_256			1
#define HCA_MTU_4096			5

/* Commands */
#define HCA_CMD_QUERY_DEVICE		0x01
#define HCA_CMD_QUERY_PORT		0x02
#define HCA_CMD_QUERY_PKEYS		0x03
#define HCA_CMD_QUERY_COUNTERS		0x04
/* Back to power-on state, catastrophic error cleared; issue it polled. */
#define HCA_CMD_RESET			0x05
#define HCA_CMD_ALLOC_PD		0x10
#define HCA_CMD_DEALLOC_PD		0x11
#define HCA_CMD_REG_MR			0x20
#define HCA_CMD_DEREG_MR		0x21
#define HCA_CMD_ALLOC_MW		0x22
#define HCA_CMD_DEALLOC_MW		0x23
#define HCA_CMD_CREATE_CQ		0x30
#define HCA_CMD_DESTROY_CQ		0x31
#define HCA_CMD_RESIZE_CQ		0x32
#define HCA_CMD_CREATE_QP		0x40
#define HCA_CMD_MODIFY_QP		0x41
#define HCA_CMD_QUERY_QP		0x42
#define HCA_CMD_DESTROY_QP		0x43
#define HCA_CMD_ATTACH_MCAST		0x44
#define HCA_CMD_DETACH_MCAST		0x45
#define HCA_CMD_SET_PORT_CAP		0x46
/* an SM's Set of PortInfo or P_KeyTable, as the SMA took it from QP0 */
#define HCA_CMD_SMP_SET			0x47
#define HCA_CMD_CREATE_SRQ		0x50
/* arms (limit > 0) or disarms (0) an SRQ's limit event */
#define HCA_CMD_MODIFY_SRQ		0x51
#define HCA_CMD_QUERY_SRQ		0x52
#define HCA_CMD_DESTROY_SRQ		0x53
#define HCA_CMD_FLAG_EVENT		(1 << 0)

/* Command status */
#define HCA_CMD_OK			0
#define HCA_CMD_BAD_OPCODE		1
#define HCA_CMD_BAD_PARAM		2
#define HCA_CMD_BAD_HANDLE		3
#define HCA_CMD_BAD_STATE		4
#define HCA_CMD_BUSY			5
#define HCA_CMD_NO_RESOURCES		6
#define HCA_CMD_BAD_ADDRESS		7
/* In a catastrophic error: only queries, teardown and RESET run. */
#define HCA_CMD_FATAL			8
/* the SMP's M_Key does not match the port's, which protects it */
#define HCA_CMD_BAD_KEY			9

#define HCA_MR_FLAG_PHYS		(1 << 0)
#define HCA_MR_FLAG_FAST_REG		(1 << 1)

/*
 * ALLOC_PD: a user process's PD. Its QPs cannot use HCA_LOCAL_DMA_LKEY and
 * no physical or fast-registration MR can be made in it.
 */
#define HCA_PD_FLAG_USER		(1 << 0)

/* Access flags (ib_access_flags) */
#define HCA_ACCESS_LOCAL_WRITE		(1 << 0)
#define HCA_ACCESS_REMOTE_WRITE		(1 << 1)
#define HCA_ACCESS_REMOTE_READ		(1 << 2)
#define HCA_ACCESS_REMOTE_ATOMIC	(1 << 3)
#define HCA_ACCESS_MW_BIND		(1 << 4)

/* Memory window types (ib_mw_type) */
#define HCA_MW_TYPE_1			1
#define HCA_MW_TYPE_2			2

/* QP types (ib_qp_type), create flags, states (ib_qp_state) */
#define HCA_QPT_SMI			0
#define HCA_QPT_GSI			1
#define HCA_QPT_RC			2
#define HCA_QPT_UC			3
#define HCA_QPT_UD			4
#define HCA_QP_FLAG_SIG_ALL		(1 << 0)
/* receives come from the SRQ srqn; the rq_* fields are unused */
#define HCA_QP_FLAG_SRQ			(1 << 1)
/*
 * with HCA_CAP_SQ_RING: every HCA_DB_SQ for this QP names it in a ring first
 * (a kernel ring for a kernel record, else its UAR's ring); a QP without it
 * is looked at on every send doorbell
 */
#define HCA_QP_FLAG_SQ_RING		(1 << 2)
#define HCA_QPS_RESET			0
#define HCA_QPS_INIT			1
#define HCA_QPS_RTR			2
#define HCA_QPS_RTS			3
#define HCA_QPS_SQD			4
#define HCA_QPS_SQE			5
#define HCA_QPS_ERR			6

/* MODIFY_QP attribute mask (ib_qp_attr_mask) */
#define HCA_QP_ATTR_STATE		(1 << 0)
#define HCA_QP_ATTR_CUR_STATE		(1 << 1)
#define HCA_QP_ATTR_ACCESS_FLAGS	(1 << 3)
#define HCA_QP_ATTR_PKEY_INDEX		(1 << 4)
#define HCA_QP_ATTR_PORT		(1 << 5)
#define HCA_QP_ATTR_QKEY		(1 << 6)
#define HCA_QP_ATTR_AV			(1 << 7)
#define HCA_QP_ATTR_PATH_MTU		(1 << 8)
#define HCA_QP_ATTR_TIMEOUT		(1 << 9)
#define HCA_QP_ATTR_RETRY_CNT		(1 << 10)
#define HCA_QP_ATTR_RNR_RETRY		(1 << 11)
#define HCA_QP_ATTR_RQ_PSN		(1 << 12)
#define HCA_QP_ATTR_MAX_QP_RD_ATOMIC	(1 << 13)
#define HCA_QP_ATTR_MIN_RNR_TIMER	(1 << 15)
#define HCA_QP_ATTR_SQ_PSN		(1 << 16)
#define HCA_QP_ATTR_MAX_DEST_RD_ATOMIC	(1 << 17)
#define HCA_QP_ATTR_DEST_QPN		(1 << 20)

/* Work request opcodes and flags */
#define HCA_WR_SEND			0
#define HCA_WR_SEND_IMM			1
#define HCA_WR_RDMA_WRITE		2
#define HCA_WR_RDMA_WRITE_IMM		3
#define HCA_WR_RDMA_READ		4
#define HCA_WR_ATOMIC_CMP_SWP		5
#define HCA_WR_ATOMIC_FETCH_ADD		6
#define HCA_WR_REG_MR			7
#define HCA_WR_LOCAL_INV		8
#define HCA_WR_SEND_INV			9
#define HCA_WR_MASKED_CMP_SWP		10
#define HCA_WR_MASKED_FETCH_ADD		11
#define HCA_WR_BIND_MW			12
/* RC: the 8 bytes in compare_add stored at remote_addr (8-aligned), no SGEs */
#define HCA_WR_ATOMIC_WRITE		13
#define HCA_WQE_SIGNALED		(1 << 0)
#define HCA_WQE_SOLICITED		(1 << 1)
#define HCA_WQE_INLINE			(1 << 2)
#define HCA_WQE_FENCE			(1 << 3)

/* CQE opcodes (ib_wc_opcode), flags and status (ib_wc_status) */
#define HCA_CQE_OP_SEND			0
#define HCA_CQE_OP_RDMA_WRITE		1
#define HCA_CQE_OP_RDMA_READ		2
#define HCA_CQE_OP_COMP_SWAP		3
#define HCA_CQE_OP_FETCH_ADD		4
#define HCA_CQE_OP_BIND_MW		5
#define HCA_CQE_OP_LOCAL_INV		6
#define HCA_CQE_OP_REG_MR		8
#define HCA_CQE_OP_MASKED_COMP_SWAP	9
#define HCA_CQE_OP_MASKED_FETCH_ADD	10
#define HCA_CQE_OP_ATOMIC_WRITE		11
#define HCA_CQE_OP_RECV			0x80
#define HCA_CQE_OP_RECV_RDMA_IMM	0x81
#define HCA_CQE_FLAG_IMM		(1 << 0)
#define HCA_CQE_FLAG_GRH		(1 << 1)
#define HCA_CQE_FLAG_INV		(1 << 2)
#define HCA_WC_SUCCESS			0
#define HCA_WC_LOC_LEN_ERR		1
#define HCA_WC_LOC_QP_OP_ERR		2
#define HCA_WC_LOC_PROT_ERR		4
#define HCA_WC_WR_FLUSH_ERR		5
#define HCA_WC_MW_BIND_ERR		6
#define HCA_WC_BAD_RESP_ERR		7
#define HCA_WC_LOC_ACCESS_ERR		8
#define HCA_WC_REM_INV_REQ_ERR		9
#define HCA_WC_REM_ACCESS_ERR		10
#define HCA_WC_REM_OP_ERR		11
#define HCA_WC_RETRY_EXC_ERR		12
#define HCA_WC_RNR_RETRY_EXC_ERR	13
#define HCA_WC_GENERAL_ERR		21

/* Event queue entries */
#define HCA_EV_COMPLETION		1
#define HCA_EV_CMD_DONE			2
#define HCA_EV_PORT_ACTIVE		3
#define HCA_EV_PORT_DOWN		4
#define HCA_EV_CQ_ERR			5
#define HCA_EV_QP_FATAL			6
#define HCA_EV_QP_ACCESS_ERR		7
/* param = SRQN: posted WQEs fell below the armed limit (now disarmed) */
#define HCA_EV_SRQ_LIMIT		8
/* param = QPN: a QP on an SRQ entered ERR (IB's Last WQE Reached) */
#define HCA_EV_QP_LAST_WQE		9
/* param = SRQN, data = reason: the SRQ's index or ring is unusable */
#define HCA_EV_SRQ_ERR			10
/* The port's P_Key table changed: read it again (QUERY_PKEYS). */
#define HCA_EV_PKEY_CHANGE		11
/* param = syndrome: port down, QPs flushed, teardown only until RESET */
#define HCA_EV_CATAS			12
/* data = HCA_PORT_CHANGE_* bits: an SM changed the port; query it again */
#define HCA_EV_PORT_CHANGE		13
#define HCA_PORT_CHANGE_LID		(1 << 0)
#define HCA_PORT_CHANGE_SM		(1 << 1)
#define HCA_PORT_CHANGE_REREG		(1 << 2)
#define HCA_CATAS_INJECTED		1
/* Reset underneath the driver: nothing it made survives, EQs included */
#define HCA_CATAS_RESET			2
#define HCA_ERR_CQ_OVERFLOW		1
#define HCA_ERR_RING_ACCESS		2
#define HCA_ERR_WQ_INDEX		3

/* Offsets of the owner bytes, written last by the device */
#define HCA_CQE_OWNER_OFFSET		29
#define HCA_EQE_OWNER_OFFSET		1

/* BAR2 offset 0, written by the device */
struct hca_dev_info {
	__u32 signature;
	__u32 abi_version;
	__u16 lid;
	__u8 port_state;
	__u8 num_vectors;
	__u32 caps;
	__u64 node_guid;
	__u32 mailbox_offset;
	__u32 eq_offset;
	__u32 eq_db_offset;
	__u32 qp_db_offset;
	__u32 cq_db_offset;
	__u32 eq_log_entries;
	__u32 doorbell_peer;	/* the peer field of every doorbell write */
	__u32 srq_db_offset;	/* with HCA_CAP_SRQ */
	__u32 catas_syndrome;	/* nonzero in a catastrophic error */
	__u32 rsvd0;
	__u64 rsvd[2];
};

/*
 * Command mailbox. Fill opcode, flags and input; write seq (a new value)
 * last; ring HCA_DB_CMD. Done when done_seq == seq; then read status and
 * output.
 */
struct hca_cmd_mailbox {
	__u32 opcode;
	__u32 flags;
	__u32 seq;
	__u32 done_seq;
	__u32 status;
	__u32 rsvd0;
	__u64 rsvd1;
	__u8 input[96];
	__u8 output[64];
	__u64 rsvd2[8];
};

struct hca_device_attr {
	__u64 fw_ver;
	__u64 node_guid;
	__u64 max_mr_size;
	__u64 page_size_cap;
	__u32 max_qp;
	__u32 max_qp_wr;
	__u32 max_cq;
	__u32 max_cqe;
	__u32 max_mr;
	__u32 max_pd;
	__u16 max_sge;
	__u16 max_inline;
	__u32 local_dma_lkey;
};

struct hca_port_attr {
	__u64 gid_prefix;
	__u64 port_guid;
	__u16 lid;
	__u16 sm_lid;
	__u8 state;
	__u8 max_mtu;
	__u8 active_mtu;
	__u8 lmc;
	__u64 mkey;
	__u16 mkey_lease;
	__u8 sm_sl;
	__u8 mkey_prot;
	__u8 subnet_timeout;
	__u8 flags;
	__u16 rsvd1;
	__u64 rsvd2[3];
};

/* SMP_SET: an SMP Set of PortInfo or P_KeyTable, data big-endian as on the wire */
struct hca_cmd_smp_set {
	__u16 attr_id;
	__u16 rsvd;
	__u32 attr_mod;
	__u64 mkey;
	__u8 data[64];
};

/*
 * QUERY_PKEYS output: the port's P_Key table, as the subnet manager set it;
 * entry 0 is the default partition's 0xffff, an entry of 0 is empty.
 */
#define HCA_PKEY_TABLE_LEN		16
struct hca_pkey_table {
	__u16 pkeys[HCA_PKEY_TABLE_LEN];
};

/*
 * QUERY_COUNTERS: eight of the port's counters from 'first' on (0 past the
 * last); each counts from the device's creation and never goes back.
 */
struct hca_cmd_counters {
	__u32 first;
	__u32 rsvd;
};

struct hca_counters {
	__u64 values[8];
};

/* Counter indices (QUERY_COUNTERS) */
#define HCA_CTR_TX_PACKETS		0	/* MTU packets, ACKs and MADs too */
#define HCA_CTR_RX_PACKETS		1
#define HCA_CTR_TX_OCTETS		2	/* on the wire: headers, payload, CRCs */
#define HCA_CTR_RX_OCTETS		3
#define HCA_CTR_TX_MCAST_PACKETS	4
#define HCA_CTR_RX_MCAST_PACKETS	5
#define HCA_CTR_TX_DISCARDS		6	/* no port has the destination LID */
#define HCA_CTR_LINK_DOWNED		7
#define HCA_CTR_ICRC_ERRORS		8
#define HCA_CTR_PKEY_VIOLATIONS		9
#define HCA_CTR_RETRANSMITS		10	/* requests sent again */
#define HCA_CTR_SEQ_NAKS		11	/* PSN sequence error NAKs received */
#define HCA_CTR_RNR_NAKS		12	/* RNR NAKs received */
#define HCA_CTR_RETRY_EXCEEDED		13
#define HCA_CTR_DUPLICATES		14	/* requests answered again */
#define HCA_CTR_UD_DROPPED		15
#define HCA_CTR_RC_DROPPED		16
#define HCA_CTR_REVOKED			17	/* accesses stopped by dereg/invalidate */
#define HCA_CTR_READ_GAPS		18
#define HCA_CTR_DMA_FAULTS		19
#define HCA_CTR_CQES_LOST		20
#define HCA_CTR_EVENTS_LOST		21
#define HCA_COUNTERS_LEN		22

/* ATTACH_MCAST / DETACH_MCAST: a UD QP and a multicast group */
struct hca_cmd_mcast {
	__u8 mgid[16];
	__u32 qpn;
	__u16 mlid;
	__u16 rsvd;
};

/* SET_PORT_CAP: the port's PortInfo:CapabilityMask (the SA shows it) */
struct hca_cmd_port_cap {
	__u32 cap_mask;
	__u32 rsvd;
};

/* One handle in or out: pdn, key, cqn, qpn */
struct hca_cmd_handle {
	__u32 handle;
	__u32 rsvd;
};

/*
 * Byte iova + k maps to page_list[(fbo + k) >> page_shift] +
 * ((fbo + k) & (page_size - 1)), fbo = iova & (page_size - 1).
 * With HCA_MR_FLAG_PHYS, iova is the guest-physical address.
 */
struct hca_cmd_reg_mr {
	__u64 iova;
	__u64 length;
	__u64 page_list;
	__u32 pdn;
	__u32 access;
	__u32 npages;
	__u32 page_shift;
	__u32 flags;
	__u32 rsvd;
};

/*
 * db_offset (with HCA_CAP_UAR): the doorbell record's BAR2 offset, inside
 * the user access regions, 8-byte aligned; 0: the default record by handle.
 */
struct hca_cmd_create_cq {
	__u64 ring_addr;
	__u32 log_entries;
	__u32 vector;
	__u32 db_offset;
	__u32 rsvd;
};

/*
 * RESIZE_CQ input: the CQ goes on in the new ring; the CQEs not yet consumed
 * (by the doorbell record's consumer index) move to its first slots and the
 * record's consumer index becomes 0. Issue it holding the CQ's poll lock.
 */
struct hca_cmd_resize_cq {
	__u64 ring_addr;
	__u32 cqn;
	__u32 log_entries;
};

/* ALLOC_PD input */
struct hca_cmd_alloc_pd {
	__u32 flags;
	__u32 rsvd;
};

struct hca_cmd_create_qp {
	__u64 sq_addr;
	__u64 rq_addr;
	__u32 pdn;
	__u32 send_cqn;
	__u32 recv_cqn;
	__u32 qp_type;
	__u32 flags;
	__u8 sq_log_entries;
	__u8 sq_wqe_shift;
	__u8 rq_log_entries;
	__u8 rq_wqe_shift;
	__u32 srqn;		/* with HCA_QP_FLAG_SRQ */
	__u32 db_offset;
};

/* CREATE_SRQ: a ring of 1 << log_entries receive WQEs, 1 << wqe_shift bytes each */
struct hca_cmd_create_srq {
	__u64 ring_addr;
	__u32 pdn;
	__u32 limit;		/* arms the limit event at once; 0: not armed */
	__u8 log_entries;
	__u8 wqe_shift;
	__u16 rsvd0;
	__u32 db_offset;
};

/* MODIFY_SRQ input, QUERY_SRQ output */
struct hca_cmd_srq_limit {
	__u32 srqn;
	__u32 limit;
};

struct hca_qp_attr {
	__u32 qkey;
	__u32 rq_psn;
	__u32 sq_psn;
	__u32 dest_qpn;
	__u32 access_flags;
	__u16 pkey_index;
	__u16 dlid;
	__u8 state;
	__u8 cur_state;
	__u8 path_mtu;
	__u8 port_num;
	__u8 timeout;
	__u8 retry_cnt;
	__u8 rnr_retry;
	__u8 min_rnr_timer;
	__u8 max_rd_atomic;
	__u8 max_dest_rd_atomic;
	__u8 sl;
	__u8 qp_type;
	__u32 rsvd;
};

struct hca_cmd_modify_qp {
	__u32 qpn;
	__u32 attr_mask;
	struct hca_qp_attr attr;
};

/* Doorbell records in BAR2: free-running indices written by the driver */
struct hca_qp_db {
	__u32 sq_pi;
	__u32 rq_pi;
};

/* The SRQ's free-running producer index; posting rings no doorbell */
struct hca_srq_db {
	__u32 pi;
	__u32 rsvd;
};

/* arm = (sn << 1) | solicited_only; a new sn arms the CQ once */
struct hca_cq_db {
	__u32 ci;
	__u32 arm;
};

struct hca_sge {
	__u64 addr;
	__u32 length;
	__u32 lkey;
};

/* Followed by num_sge struct hca_sge, or inline_len bytes of data */
struct hca_send_wqe {
	__u64 wr_id;
	__u8 opcode;
	__u8 flags;
	__u8 num_sge;
	__u8 rsvd0;
	__u32 imm;
	__u64 remote_addr;
	__u32 rkey;
	__u32 inline_len;
	__u32 ud_remote_qpn;
	__u32 ud_qkey;
	__u16 ud_dlid;
	__u16 ud_pkey_index;	/* QP1: the P_Key table entry its MAD carries */
	__u32 rsvd2;
	__u64 compare_add;
	__u64 swap;
};

/*
 * Opcode HCA_WR_REG_MR: maps fast-registration MR key >> 8 to
 * [iova, iova + length) over page_list (u64 guest-physical pages of
 * 1 << page_shift bytes) with access; key's low byte is its new tag.
 */
struct hca_reg_mr_wqe {
	__u64 wr_id;
	__u8 opcode;
	__u8 flags;
	__u16 rsvd0;
	__u32 access;
	__u64 iova;
	__u32 key;
	__u32 npages;
	__u64 length;
	__u64 page_list;
	__u32 page_shift;
	__u32 rsvd1;
	__u64 rsvd2;
};

/*
 * Opcode HCA_WR_BIND_MW: binds memory window mw_key >> 8 to
 * [addr, addr + length) of the MR mr_key (same PD, HCA_ACCESS_MW_BIND) with
 * the remote rights in access, and makes new_key its key. A type 2 window
 * must be unbound and is bound to this QP; type 1 with length 0 unbinds.
 */
struct hca_bind_mw_wqe {
	__u64 wr_id;
	__u8 opcode;
	__u8 flags;
	__u16 rsvd0;
	__u32 access;
	__u64 addr;
	__u64 length;
	__u32 mw_key;
	__u32 new_key;
	__u32 mr_key;
	__u32 rsvd1;
	__u64 rsvd2[2];
};

/* HCA_CMD_ALLOC_MW input; the output handle is the window's key */
struct hca_cmd_alloc_mw {
	__u32 pdn;
	__u32 mw_type;
};

/*
 * HCA_WR_MASKED_CMP_SWP / HCA_WR_MASKED_FETCH_ADD: a send WQE whose UD fields
 * (unused by an RC atomic) carry the masks; num_sge struct hca_sge (the 8-byte
 * result buffer) follow. compare_add_mask: the bits compared (CMP_SWP) or the
 * fields' top bits, past which no carry goes (FETCH_ADD); swap_mask: the bits
 * swapped (CMP_SWP).
 */
struct hca_masked_atomic_wqe {
	__u64 wr_id;
	__u8 opcode;
	__u8 flags;
	__u8 num_sge;
	__u8 rsvd0;
	__u32 rsvd1;
	__u64 remote_addr;
	__u32 rkey;
	__u32 rsvd2;
	__u64 compare_add_mask;
	__u64 swap_mask;
	__u64 compare_add;
	__u64 swap;
};

/* Followed by num_sge struct hca_sge */
struct hca_recv_wqe {
	__u64 wr_id;
	__u8 num_sge;
	__u8 rsvd[7];
};

/* Valid when owner == ((index >> log_entries) & 1) ^ 1 */
struct hca_cqe {
	__u64 wr_id;
	__u32 byte_len;
	__u32 imm;
	__u32 qpn;
	__u32 src_qp;
	__u16 slid;
	__u8 opcode;
	__u8 status;
	__u8 flags;
	__u8 owner;
	__u16 pkey_index;
};

struct hca_eqe {
	__u8 event_type;
	__u8 owner;
	__u16 rsvd0;
	__u32 param;
	__u32 data;
	__u32 rsvd1;
};

_Static_assert(sizeof(struct hca_dev_info) == 80, "hca_dev_info");
_Static_assert(sizeof(struct hca_cmd_mailbox) == 256, "hca_cmd_mailbox");
_Static_assert(sizeof(struct hca_device_attr) == 64, "hca_device_attr");
_Static_assert(sizeof(struct hca_port_attr) == 64, "hca_port_attr");
_Static_assert(sizeof(struct hca_cmd_smp_set) == 80, "hca_cmd_smp_set");
_Static_assert(sizeof(struct hca_pkey_table) == 32, "hca_pkey_table");
_Static_assert(sizeof(struct hca_cmd_counters) == 8, "hca_cmd_counters");
_Static_assert(sizeof(struct hca_counters) == 64, "hca_counters");
_Static_assert(sizeof(struct hca_cmd_reg_mr) == 48, "hca_cmd_reg_mr");
_Static_assert(sizeof(struct hca_cmd_create_cq) == 24, "hca_cmd_create_cq");
_Static_assert(sizeof(struct hca_cmd_resize_cq) == 16, "hca_cmd_resize_cq");
_Static_assert(sizeof(struct hca_cmd_alloc_pd) == 8, "hca_cmd_alloc_pd");
_Static_assert(sizeof(struct hca_cmd_create_qp) == 48, "hca_cmd_create_qp");
_Static_assert(sizeof(struct hca_cmd_create_srq) == 24, "hca_cmd_create_srq");
_Static_assert(sizeof(struct hca_cmd_modify_qp) == 48, "hca_cmd_modify_qp");
_Static_assert(sizeof(struct hca_send_wqe) == 64, "hca_send_wqe");
_Static_assert(sizeof(struct hca_reg_mr_wqe) == 64, "hca_reg_mr_wqe");
_Static_assert(sizeof(struct hca_bind_mw_wqe) == 64, "hca_bind_mw_wqe");
_Static_assert(sizeof(struct hca_cmd_alloc_mw) == 8, "hca_cmd_alloc_mw");
_Static_assert(sizeof(struct hca_masked_atomic_wqe) == 64, "hca_masked_atomic_wqe");
_Static_assert(sizeof(struct hca_recv_wqe) == 16, "hca_recv_wqe");
_Static_assert(sizeof(struct hca_cqe) == 32, "hca_cqe");
_Static_assert(sizeof(struct hca_eqe) == 16, "hca_eqe");

/* The owner bit a producer writes at free-running index idx */
static inline __u8 hca_owner_bit(__u32 idx, __u32 log_entries)
{
	return ((idx >> log_entries) & 1) ^ 1;
}

#endif /* HCA_ABI_H */
