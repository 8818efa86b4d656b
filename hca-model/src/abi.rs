//! The guest-visible ABI of the hcabench HCA, as Rust definitions.
//!
//! `docs/hca-abi.md` is the prose; `guest-kmod/include/hca_abi.h` is the C twin of this file.
//! Constant names here are the C names without their `HCA_` prefix, struct names are the C
//! `struct hca_*` names in CamelCase, and field names are identical. `tests/abi_c.rs` compiles
//! the header and compares every entry of [`layout`] with what C computes.
//!
//! All multi-byte fields are little-endian (x86-64 guests), except that `imm` fields are
//! opaque 32-bit values copied end to end (ib_core keeps immediate data big-endian).
//! Enumerations reuse ib_core's numbering wherever ib_core has one (QP state and type, WC
//! status and opcode, access flags, modify-QP attribute mask), so the driver maps them 1:1.

use vm_memory::ByteValued;

/// ABI version in [`HcaDevInfo::abi_version`]; bumped on any incompatible change.
pub const ABI_VERSION: u32 = 1;
/// "HCAB" read as a little-endian u32: tells an hcabench HCA from a plain ivshmem device.
pub const SIGNATURE: u32 = 0x4241_4348;

// ---- PCI identity -------------------------------------------------------------------------
/// ivshmem-doorbell's IDs (QEMU host): the driver checks BAR2's signature before binding.
pub const PCI_VENDOR_IVSHMEM: u32 = 0x1af4;
/// ivshmem-doorbell's PCI device ID.
pub const PCI_DEVICE_IVSHMEM: u32 = 0x1110;
/// The VMM's own HCA function (a vendor ID from the "experimental" range used by QEMU's edu).
pub const PCI_VENDOR_HCABENCH: u32 = 0x1234;
/// The VMM's own HCA function's PCI device ID.
pub const PCI_DEVICE_HCABENCH: u32 = 0x21a8;

/// A port's local identifier (LID): the 16-bit address packets are routed by within a
/// subnet. 0 is invalid, 1 up to 0xbfff are unicast (the fabric hands nodes 1, 2, ... and
/// keeps the top one for its SM), and multicast LIDs start at [`MCAST_LID_FIRST`].
pub type Lid = u16;

/// Node GUIDs carry Mellanox's OUI (00:02:c9, as the MT21108 family reported) and the
/// node's LID in the low bits, so node N has the same GUID on every backend and every run.
pub const NODE_GUID_PREFIX: u64 = 0x0002_c903_0000_0000;

/// The node GUID (also its port GUID) of the node at `lid`.
pub const fn node_guid(lid: Lid) -> u64 {
    NODE_GUID_PREFIX | lid as u64
}

// ---- BAR0: ivshmem register layout --------------------------------------------------------
/// ivshmem's interrupt mask register (unused with MSI-X).
pub const BAR0_INTR_MASK: u32 = 0x00;
/// ivshmem's interrupt status register (unused with MSI-X).
pub const BAR0_INTR_STATUS: u32 = 0x04;
/// ivshmem's IVPosition: this peer's id, read-only.
pub const BAR0_IV_POSITION: u32 = 0x08;
/// ivshmem's doorbell register: the driver writes `peer << DOORBELL_PEER_SHIFT | class`.
pub const BAR0_DOORBELL: u32 = 0x0c;
/// Doorbell value = `peer << DOORBELL_PEER_SHIFT | class`; only the low 8 bits of the class count.
pub const DOORBELL_PEER_SHIFT: u32 = 16;

// ---- Doorbell classes (guest -> device vectors) -------------------------------------------
/// The command mailbox holds a new command (its `seq` moved).
pub const DB_CMD: u32 = 0;
/// Some QP's send-queue producer index moved.
pub const DB_SQ: u32 = 1;
/// Some QP's receive-queue producer index moved.
pub const DB_RQ: u32 = 2;
/// Some CQ's arm word moved.
pub const DB_CQ_ARM: u32 = 3;
/// Doorbell classes and MSI-X vectors share one count (ivshmem's `vectors=`).
pub const NUM_VECTORS: u32 = 4;

// ---- Interrupt vectors (device -> guest) --------------------------------------------------
/// Vector 0 carries command completions and asynchronous events (EQ 0).
pub const VEC_ASYNC: u32 = 0;
/// Vectors 1..NUM_VECTORS carry CQ completion events; a CQ names its vector at creation.
pub const VEC_COMP_FIRST: u32 = 1;

// ---- BAR2: device memory layout -----------------------------------------------------------
/// BAR2's size: device memory from [`HcaDevInfo`] to the last user access region.
pub const BAR2_SIZE: u32 = 0x8_0000;
/// Where [`HcaDevInfo`] sits in BAR2.
pub const BAR2_INFO_OFFSET: u32 = 0x0000;
/// Where the command mailbox ([`HcaCmdMailbox`]) sits in BAR2.
pub const BAR2_MAILBOX_OFFSET: u32 = 0x1000;
/// One u32 consumer index per EQ, 16 bytes apart.
pub const BAR2_EQ_DB_OFFSET: u32 = 0x2000;
/// Bytes between two EQs' consumer-index records.
pub const EQ_DB_STRIDE: u32 = 16;
/// EQ rings, one per vector, `EQ_ENTRIES` entries each.
pub const BAR2_EQ_OFFSET: u32 = 0x3000;
/// Each EQ ring holds `1 << EQ_LOG_ENTRIES` entries.
pub const EQ_LOG_ENTRIES: u32 = 8;
/// Entries in each EQ ring.
pub const EQ_ENTRIES: u32 = 1 << EQ_LOG_ENTRIES;
/// QP doorbell records, indexed by QPN.
pub const BAR2_QP_DB_OFFSET: u32 = 0x8000;
/// CQ doorbell records, indexed by CQN.
pub const BAR2_CQ_DB_OFFSET: u32 = 0xa000;
/// SRQ doorbell records, indexed by SRQN.
pub const BAR2_SRQ_DB_OFFSET: u32 = 0xb000;
/// Send-doorbell rings of the kernel (with CAP_SQ_RING): `SQ_RINGS` rings, `SQ_RING_STRIDE`
/// bytes apart, each laid out as [`SQ_RING_PI`] and [`SQ_RING_QPN_OFFSET`] say. Before it
/// rings DB_SQ for a QP created with QP_FLAG_SQ_RING, the driver appends the QPN to one
/// ring (its CPU's: one writer per ring), so that the device runs the send queues named
/// instead of looking at every QP. A process's QPs are named in its UAR's ring
/// (`uapi::UAR_SQ_RING_OFFSET`), of the same layout.
pub const BAR2_SQ_RING_OFFSET: u32 = 0xc000;
/// Bytes between two send-doorbell rings.
pub const SQ_RING_STRIDE: u32 = 0x200;
/// How many kernel send-doorbell rings there are (one per CPU, up to this many).
pub const SQ_RINGS: u32 = 32;
/// In a ring: the writer's free-running producer index (u32), stored after the QPN it
/// publishes. The device keeps its consumer index to itself.
pub const SQ_RING_PI: u32 = 0x00;
/// In the kernel's ring 0 alone: how many kernel rings, from ring 0, the driver writes (as
/// many as it has CPUs); a send doorbell reads those only. 0, or more than `SQ_RINGS`: all.
pub const SQ_RINGS_USED: u32 = 0x04;
/// In a ring: `SQ_RING_ENTRIES` u32 QPNs; the one of index `i` at
/// `SQ_RING_QPN_OFFSET + 4 * (i % SQ_RING_ENTRIES)`.
pub const SQ_RING_QPN_OFFSET: u32 = 0x40;
/// QPNs one send-doorbell ring holds before its writer wraps.
pub const SQ_RING_ENTRIES: u32 = 64;
/// User access regions: pages the guest kernel hands to processes (one per user context),
/// holding the doorbell records of that process's QPs, CQs and SRQs (`db_offset` at
/// creation). A process mapping one page can move only its own queues' records.
pub const BAR2_UAR_OFFSET: u32 = 0x1_0000;
/// Bytes of one user access region (one page).
pub const UAR_SIZE: u32 = 0x1000;
/// How many user access regions BAR2 holds.
pub const MAX_UAR: u32 = (BAR2_SIZE - BAR2_UAR_OFFSET) / UAR_SIZE;

// ---- Device limits ------------------------------------------------------------------------
/// QPs one HCA holds at most (QPN 0 and 1 are QP0 and QP1).
pub const MAX_QP: u32 = 1024;
/// CQs one HCA holds at most (CQN 0 is never handed out).
pub const MAX_CQ: u32 = 256;
/// Shared receive queues (SRQN 0 is never handed out), and the WQEs one holds at most.
pub const MAX_SRQ: u32 = 256;
/// An SRQ holds at most `1 << MAX_SRQ_LOG_WR` WQEs.
pub const MAX_SRQ_LOG_WR: u32 = 14;
/// PDs one HCA holds at most.
pub const MAX_PD: u32 = 1024;
/// MRs one HCA holds at most (an MR's index is its key's upper 24 bits).
pub const MAX_MR: u32 = 4096;
/// A send or receive queue holds at most `1 << MAX_QP_LOG_WR` WQEs.
pub const MAX_QP_LOG_WR: u32 = 14;
/// A CQ holds at most `1 << MAX_CQ_LOG_CQE` CQEs.
pub const MAX_CQ_LOG_CQE: u32 = 16;
/// SGEs one WQE may carry at most.
pub const MAX_SGE: u32 = 16;
/// Inline bytes one send WQE may carry at most.
pub const MAX_INLINE: u32 = 512;
/// The smallest send WQE stride, as a shift (64 bytes: the header alone).
pub const MIN_SQ_WQE_SHIFT: u32 = 6;
/// The largest send WQE stride, as a shift (1 KiB: the header and `MAX_SGE` SGEs or `MAX_INLINE` bytes).
pub const MAX_SQ_WQE_SHIFT: u32 = 10;
/// The smallest receive WQE stride, as a shift (16 bytes: the header alone).
pub const MIN_RQ_WQE_SHIFT: u32 = 4;
/// The largest receive WQE stride, as a shift (512 bytes: the header and `MAX_SGE` SGEs).
pub const MAX_RQ_WQE_SHIFT: u32 = 9;
/// Pages one MR's page list may hold, and pages all MRs together may hold.
pub const MAX_MR_PAGES: u32 = 1 << 20;
/// Pages all of an HCA's MRs together may map.
pub const MAX_TOTAL_MR_PAGES: u32 = 1 << 22;
/// The smallest MR page size, as a shift (4 KiB).
pub const MIN_MR_PAGE_SHIFT: u32 = 12;
/// The largest MR page size, as a shift (1 GiB).
pub const MAX_MR_PAGE_SHIFT: u32 = 30;
/// Largest message (IB's 2^31).
pub const MAX_MSG_SIZE: u32 = 1 << 31;
/// The reserved lkey valid in every PD for local access to any guest-physical address.
pub const LOCAL_DMA_LKEY: u32 = 0x0000_0001;
/// Bytes reserved at the start of every UD receive buffer for the GRH.
pub const UD_GRH_BYTES: u32 = 40;
/// Multicast LIDs run from here to 0xfffe (0xffff is the permissive LID).
pub const MCAST_LID_FIRST: u32 = 0xc000;
/// Multicast attachments (QP, group) one HCA holds at most.
pub const MAX_MCAST_ATTACH: u32 = 1024;
/// Host memory one device holds for requests in flight (payload copies and gather lists
/// kept to resend from): past it, send queues wait for completions. One WR may overshoot by
/// its own size (at most one gather record per page of a 2 GiB message).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
/// The least a host may set that budget to (`Hca::set_in_flight_budget`). Any budget makes
/// progress (a send queue goes on while the device holds less); this keeps a cluster file's
/// typo from making every QP wait for every other's WR.
pub const MIN_IN_FLIGHT_BYTES: usize = 4 << 20;
/// The GSI QP (QP1) always has this number and Q_Key.
pub const GSI_QPN: u32 = 1;
/// The GSI QP's well-known Q_Key: every MAD on QP1 carries it.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The SMI QP (QP0) always has this number. It takes only what another port's QP0 sent
/// (subnet management packets), whatever its P_Key or Q_Key, and only a QP0 takes that.
pub const SMI_QPN: u32 = 0;

// ---- Capability bits in HcaDevInfo::caps --------------------------------------------------
/// Reliable connected QPs.
pub const CAP_RC: u32 = 1 << 0;
/// Unreliable datagram QPs.
pub const CAP_UD: u32 = 1 << 1;
/// RDMA READ requests and responses.
pub const CAP_RDMA_READ: u32 = 1 << 2;
/// Atomic compare-and-swap and fetch-and-add (8 bytes).
pub const CAP_ATOMIC: u32 = 1 << 3;
/// The reserved [`LOCAL_DMA_LKEY`].
pub const CAP_LOCAL_DMA_LKEY: u32 = 1 << 4;
/// Masked atomics (`WR_MASKED_CMP_SWP`, `WR_MASKED_FETCH_ADD`).
pub const CAP_MASKED_ATOMIC: u32 = 1 << 5;
/// Shared receive queues (CREATE_SRQ and friends; `HcaDevInfo::srq_db_offset`).
pub const CAP_SRQ: u32 = 1 << 6;
/// User access regions: `db_offset` in CREATE_CQ/QP/SRQ and user PDs (`PD_FLAG_USER`).
pub const CAP_UAR: u32 = 1 << 7;
/// Send-doorbell rings (`BAR2_SQ_RING_OFFSET`, `uapi::UAR_SQ_RING_OFFSET`) and
/// `QP_FLAG_SQ_RING`.
pub const CAP_SQ_RING: u32 = 1 << 8;
/// Memory windows (ALLOC_MW, DEALLOC_MW, `WR_BIND_MW`, `ACCESS_MW_BIND`) and UC QPs.
pub const CAP_MW_UC: u32 = 1 << 9;
/// Catastrophic errors and their recovery: `EV_CATAS`, `HcaDevInfo::catas_syndrome`,
/// `CMD_RESET` and `CMD_FATAL`.
pub const CAP_RESET: u32 = 1 << 10;

// ---- Port (ib_port_state numbering) -------------------------------------------------------
/// The port has no link (no fabric, or the fabric has its link down).
pub const PORT_DOWN: u32 = 1;
/// The link is up and waits for a subnet manager (a user's SM, `CMD_SMP_SET`): only
/// SMPs pass.
pub const PORT_INIT: u32 = 2;
/// The subnet manager armed the port: the next step is ACTIVE.
pub const PORT_ARMED: u32 = 3;
/// The port's link is up and it has a LID: it sends and receives.
pub const PORT_ACTIVE: u32 = 4;
/// `HcaPortAttr::flags`: a subnet manager in a guest manages the port, which takes its
/// Sets (`CMD_SMP_SET`); without it the fabric's own SM does, and the port takes none.
pub const PORT_FLAG_GUEST_SM: u8 = 1 << 0;
/// The largest M_KeyProtectBits (PortInfo): 2 and 3 hide the M_Key from every Get.
pub const MKEY_PROT_MAX: u8 = 3;
/// ib_mtu numbering: 1 = 256 bytes ... 5 = 4096 bytes.
pub const MTU_256: u32 = 1;
/// 4096-byte MTU, the only one the port offers.
pub const MTU_4096: u32 = 5;

// ---- Commands -----------------------------------------------------------------------------
/// The device's attributes ([`HcaDeviceAttr`]).
pub const CMD_QUERY_DEVICE: u32 = 0x01;
/// The port's attributes ([`HcaPortAttr`]).
pub const CMD_QUERY_PORT: u32 = 0x02;
/// The port's P_Key table ([`HcaPKeyTable`]), as the subnet manager set it.
pub const CMD_QUERY_PKEYS: u32 = 0x03;
/// Eight of the port's counters from `HcaCmdCounters::first` on ([`HcaCounters`]).
pub const CMD_QUERY_COUNTERS: u32 = 0x04;
/// Resets the function: every PD, MR, window, CQ, QP, SRQ, multicast attachment, user
/// access region, EQ and the mailbox's sequence go, BAR2 is as at power-on (its header
/// rewritten), and a catastrophic error is cleared. Issue it polled (no `CMD_FLAG_EVENT`:
/// the EQs it empties could not carry the completion); `done_seq` then reads `seq`.
pub const CMD_RESET: u32 = 0x05;
/// Allocates a PD ([`HcaCmdAllocPd`] in, [`HcaCmdHandle`] out).
pub const CMD_ALLOC_PD: u32 = 0x10;
/// Frees a PD that no MR, QP or SRQ uses.
pub const CMD_DEALLOC_PD: u32 = 0x11;
/// Registers an MR ([`HcaCmdRegMr`] in; its key as [`HcaCmdHandle`] out).
pub const CMD_REG_MR: u32 = 0x20;
/// Deregisters the MR with the key given.
pub const CMD_DEREG_MR: u32 = 0x21;
/// A memory window (`HcaCmdAllocMw`); the output handle is its key, unbound until a
/// WR_BIND_MW binds it.
pub const CMD_ALLOC_MW: u32 = 0x22;
/// Frees the memory window whose key is the input handle (its current key, or the one
/// ALLOC_MW gave): the window stops granting access at once.
pub const CMD_DEALLOC_MW: u32 = 0x23;
/// Creates a CQ ([`HcaCmdCreateCq`] in, its CQN out).
pub const CMD_CREATE_CQ: u32 = 0x30;
/// Destroys a CQ that no QP uses.
pub const CMD_DESTROY_CQ: u32 = 0x31;
/// Moves a CQ to a new ring (HcaCmdResizeCq): see `cmd_resize_cq`.
pub const CMD_RESIZE_CQ: u32 = 0x32;
/// Creates a QP ([`HcaCmdCreateQp`] in, its QPN out).
pub const CMD_CREATE_QP: u32 = 0x40;
/// Moves a QP through its states and sets its attributes ([`HcaCmdModifyQp`]).
pub const CMD_MODIFY_QP: u32 = 0x41;
/// A QP's attributes ([`HcaQpAttr`] out).
pub const CMD_QUERY_QP: u32 = 0x42;
/// Destroys a QP; its WQEs are not completed.
pub const CMD_DESTROY_QP: u32 = 0x43;
/// Attach a UD QP to a multicast group (MGID, MLID): it receives the group's packets.
pub const CMD_ATTACH_MCAST: u32 = 0x44;
/// Detaches a UD QP from a multicast group ([`HcaCmdMcast`]).
pub const CMD_DETACH_MCAST: u32 = 0x45;
/// Sets the port's capability mask ([`HcaCmdPortCap`]).
pub const CMD_SET_PORT_CAP: u32 = 0x46;
/// A subnet manager's Set of the port's PortInfo or P_KeyTable, as its SMA took it from
/// QP0 ([`HcaCmdSmpSet`]); the port changes only if the SMP's M_Key passes (else
/// [`CMD_BAD_KEY`]) and every field is one it can take (else `CMD_BAD_PARAM`).
pub const CMD_SMP_SET: u32 = 0x47;
/// Creates an SRQ ([`HcaCmdCreateSrq`] in, its SRQN out).
pub const CMD_CREATE_SRQ: u32 = 0x50;
/// Arms (limit > 0) or disarms (0) an SRQ's limit event.
pub const CMD_MODIFY_SRQ: u32 = 0x51;
/// An SRQ's limit ([`HcaCmdSrqLimit`] out).
pub const CMD_QUERY_SRQ: u32 = 0x52;
/// Destroys an SRQ that no QP uses.
pub const CMD_DESTROY_SRQ: u32 = 0x53;
/// Mailbox flag: post an EV_CMD_DONE event on EQ 0 and raise vector 0 when done.
pub const CMD_FLAG_EVENT: u32 = 1 << 0;

// Command status codes (HcaCmdMailbox::status).
/// The command succeeded.
pub const CMD_OK: u32 = 0;
/// No command has this opcode.
pub const CMD_BAD_OPCODE: u32 = 1;
/// An input field is out of range or inconsistent.
pub const CMD_BAD_PARAM: u32 = 2;
/// The handle (PDN, key, CQN, QPN, SRQN) names nothing live.
pub const CMD_BAD_HANDLE: u32 = 3;
/// The object is in a state that forbids the command (a QP transition IB does not allow).
pub const CMD_BAD_STATE: u32 = 4;
/// The object is still in use (a PD with MRs, a CQ with QPs).
pub const CMD_BUSY: u32 = 5;
/// A table or the device's page budget is full.
pub const CMD_NO_RESOURCES: u32 = 6;
/// A guest address in the input is outside guest memory or misaligned.
pub const CMD_BAD_ADDRESS: u32 = 7;
/// The device is in a catastrophic error: only queries, teardown (destroy, dealloc,
/// deregister, detach, MODIFY_QP to RESET or ERR) and RESET run.
pub const CMD_FATAL: u32 = 8;
/// An SMP's M_Key does not match the port's, which protects it (IBA 14.2.4).
pub const CMD_BAD_KEY: u32 = 9;

// REG_MR flags.
/// Physical (DMA) MR: iova is the guest-physical address, no page list.
pub const MR_FLAG_PHYS: u32 = 1 << 0;
/// Fast-registration MR: reserves room for `npages` pages and maps nothing until an
/// `WR_REG_MR` work request maps it (ib_alloc_mr + IB_WR_REG_MR).
pub const MR_FLAG_FAST_REG: u32 = 1 << 1;

/// ALLOC_PD: a PD for a user process. Its QPs cannot use LOCAL_DMA_LKEY, and no
/// guest-physical or fast-registration MR can be made in it: a process reaches only the
/// memory its kernel registered for it.
pub const PD_FLAG_USER: u32 = 1 << 0;

// Access flags (ib_access_flags numbering).
/// The local side may write the memory (receives, READ responses, atomic results).
pub const ACCESS_LOCAL_WRITE: u32 = 1 << 0;
/// A peer may RDMA WRITE to the memory.
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// A peer may RDMA READ the memory.
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
/// A peer may run atomics on the memory.
pub const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
/// An MR's: memory windows may be bound to it (ib_access_flags' MW_BIND).
pub const ACCESS_MW_BIND: u32 = 1 << 4;

// Memory window types (ib_mw_type).
/// Bound by a WR_BIND_MW on any QP of its PD; rebound (a length of 0 unbinds) at will.
pub const MW_TYPE_1: u32 = 1;
/// Bound to the QP whose WR_BIND_MW bound it, which alone takes remote access through it;
/// unbound by LOCAL_INV or a SEND with Invalidate naming its key.
pub const MW_TYPE_2: u32 = 2;

// QP types (ib_qp_type numbering).
/// QP0, the subnet management QP.
pub const QPT_SMI: u32 = 0;
/// QP1, the general services QP that carries MADs.
pub const QPT_GSI: u32 = 1;
/// Reliable connected.
pub const QPT_RC: u32 = 2;
/// Unreliable connected: RC's SENDs and WRITEs to one peer, without ACKs or resends.
pub const QPT_UC: u32 = 3;
/// Unreliable datagram.
pub const QPT_UD: u32 = 4;
// CREATE_QP flags.
/// Every send WR completes with a CQE (ib_qp_init_attr.sq_sig_type == IB_SIGNAL_ALL_WR).
pub const QP_FLAG_SIG_ALL: u32 = 1 << 0;
/// Receives come from the SRQ `srqn`; the QP has no receive queue of its own.
pub const QP_FLAG_SRQ: u32 = 1 << 1;
/// With CAP_SQ_RING: every DB_SQ rung for this QP's send queue names it in a send-doorbell
/// ring first (a kernel ring for a record at `BAR2_QP_DB_OFFSET`, else its UAR's ring), so
/// a send doorbell need not look at it otherwise. A QP without it is looked at on every
/// send doorbell, as before the rings.
pub const QP_FLAG_SQ_RING: u32 = 1 << 2;

// QP states (ib_qp_state numbering).
/// Reset: holds no WQEs and takes no packets.
pub const QPS_RESET: u32 = 0;
/// Initialised: receives may be posted, nothing is sent or taken.
pub const QPS_INIT: u32 = 1;
/// Ready to receive.
pub const QPS_RTR: u32 = 2;
/// Ready to send.
pub const QPS_RTS: u32 = 3;
/// Send queue drained.
pub const QPS_SQD: u32 = 4;
/// Send queue error (UD): the send queue stopped after a WQE failed.
pub const QPS_SQE: u32 = 5;
/// Error: every WQE completes flushed.
pub const QPS_ERR: u32 = 6;

// MODIFY_QP attribute mask (ib_qp_attr_mask numbering).
/// Sets `state`.
pub const QP_ATTR_STATE: u32 = 1 << 0;
/// Checks `cur_state`.
pub const QP_ATTR_CUR_STATE: u32 = 1 << 1;
/// Sets `access_flags` (what a peer may do through this QP).
pub const QP_ATTR_ACCESS_FLAGS: u32 = 1 << 3;
/// Sets `pkey_index`.
pub const QP_ATTR_PKEY_INDEX: u32 = 1 << 4;
/// Sets `port_num`.
pub const QP_ATTR_PORT: u32 = 1 << 5;
/// Sets `qkey` (UD).
pub const QP_ATTR_QKEY: u32 = 1 << 6;
/// Sets the address vector (`dlid`, `sl`).
pub const QP_ATTR_AV: u32 = 1 << 7;
/// Sets `path_mtu`.
pub const QP_ATTR_PATH_MTU: u32 = 1 << 8;
/// Sets `timeout` (RC's local ACK timeout).
pub const QP_ATTR_TIMEOUT: u32 = 1 << 9;
/// Sets `retry_cnt`.
pub const QP_ATTR_RETRY_CNT: u32 = 1 << 10;
/// Sets `rnr_retry`.
pub const QP_ATTR_RNR_RETRY: u32 = 1 << 11;
/// Sets `rq_psn`.
pub const QP_ATTR_RQ_PSN: u32 = 1 << 12;
/// Sets `max_rd_atomic` (READs and atomics this QP has outstanding).
pub const QP_ATTR_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
/// Sets `min_rnr_timer`.
pub const QP_ATTR_MIN_RNR_TIMER: u32 = 1 << 15;
/// Sets `sq_psn`.
pub const QP_ATTR_SQ_PSN: u32 = 1 << 16;
/// Sets `max_dest_rd_atomic` (READs and atomics it answers at once).
pub const QP_ATTR_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
/// Sets `dest_qpn` (RC).
pub const QP_ATTR_DEST_QPN: u32 = 1 << 20;

// ---- Work requests ------------------------------------------------------------------------
/// SEND: the payload lands in the peer's next receive.
pub const WR_SEND: u32 = 0;
/// SEND with immediate data.
pub const WR_SEND_IMM: u32 = 1;
/// RDMA WRITE to `remote_addr` under `rkey`.
pub const WR_RDMA_WRITE: u32 = 2;
/// RDMA WRITE with immediate data, which consumes a receive at the peer.
pub const WR_RDMA_WRITE_IMM: u32 = 3;
/// RDMA READ from `remote_addr` under `rkey` into the local SGEs.
pub const WR_RDMA_READ: u32 = 4;
/// Atomic compare-and-swap of 8 bytes.
pub const WR_ATOMIC_CMP_SWP: u32 = 5;
/// Atomic fetch-and-add of 8 bytes.
pub const WR_ATOMIC_FETCH_ADD: u32 = 6;
/// Maps a fast-registration MR; the WQE is an `HcaRegMrWqe`.
pub const WR_REG_MR: u32 = 7;
/// Invalidates the fast-registration MR whose key is in `imm` (ib_post_send's LOCAL_INV).
pub const WR_LOCAL_INV: u32 = 8;
/// A SEND (RC) that makes the responder invalidate the MR whose rkey is in `imm` (IETH).
pub const WR_SEND_INV: u32 = 9;
/// Compare-and-swap under masks; the WQE is an `HcaMaskedAtomicWqe`. The 8 bytes at
/// `remote_addr` become `(orig & !swap_mask) | (swap & swap_mask)` when `orig` and
/// `compare_add` agree on the bits of `compare_add_mask`; the result buffer gets `orig`.
pub const WR_MASKED_CMP_SWP: u32 = 10;
/// Fetch-and-add of several fields at once; the WQE is an `HcaMaskedAtomicWqe`. A set bit
/// of `compare_add_mask` is the top bit of a field: no carry goes past it.
pub const WR_MASKED_FETCH_ADD: u32 = 11;
/// Binds a memory window; the WQE is an `HcaBindMwWqe`.
pub const WR_BIND_MW: u32 = 12;
/// RC: stores the 8 bytes in `compare_add` (as the consumer gave them) at `remote_addr`
/// (8-byte aligned) in one store, under `rkey`'s remote write right (IBTA 1.5's ATOMIC
/// WRITE); no SGEs.
pub const WR_ATOMIC_WRITE: u32 = 13;

/// The WR completes with a CQE even on a QP without QP_FLAG_SIG_ALL.
pub const WQE_SIGNALED: u32 = 1 << 0;
/// The receiver's CQ event fires for it even when armed for solicited completions only.
pub const WQE_SOLICITED: u32 = 1 << 1;
/// The payload is inline in the WQE, not gathered from SGEs.
pub const WQE_INLINE: u32 = 1 << 2;
/// The WR waits until every earlier READ and atomic on its QP has completed.
pub const WQE_FENCE: u32 = 1 << 3;

// ---- Completions (ib_wc_opcode / ib_wc_status numbering) ----------------------------------
/// A SEND completed.
pub const CQE_OP_SEND: u32 = 0;
/// An RDMA WRITE completed.
pub const CQE_OP_RDMA_WRITE: u32 = 1;
/// An RDMA READ completed.
pub const CQE_OP_RDMA_READ: u32 = 2;
/// A compare-and-swap completed.
pub const CQE_OP_COMP_SWAP: u32 = 3;
/// A fetch-and-add completed.
pub const CQE_OP_FETCH_ADD: u32 = 4;
/// A memory window bind completed.
pub const CQE_OP_BIND_MW: u32 = 5;
/// A local invalidate completed.
pub const CQE_OP_LOCAL_INV: u32 = 6;
/// A fast registration completed.
pub const CQE_OP_REG_MR: u32 = 8;
/// A masked compare-and-swap completed.
pub const CQE_OP_MASKED_COMP_SWAP: u32 = 9;
/// A masked fetch-and-add completed.
pub const CQE_OP_MASKED_FETCH_ADD: u32 = 10;
/// An ATOMIC WRITE completed (not ib_wc_opcode's number, which differs between kernels).
pub const CQE_OP_ATOMIC_WRITE: u32 = 11;
/// A receive took a SEND.
pub const CQE_OP_RECV: u32 = 0x80;
/// A receive took an RDMA WRITE with immediate data.
pub const CQE_OP_RECV_RDMA_IMM: u32 = 0x81;

/// `imm` holds immediate data.
pub const CQE_FLAG_IMM: u32 = 1 << 0;
/// The entry's receive buffer begins with a (zeroed) GRH slot.
pub const CQE_FLAG_GRH: u32 = 1 << 1;
/// The received SEND invalidated the rkey in `imm` (SEND with Invalidate).
pub const CQE_FLAG_INV: u32 = 1 << 2;

/// The WR completed.
pub const WC_SUCCESS: u32 = 0;
/// Local length error: a message longer than the receive, or than the MTU on UD.
pub const WC_LOC_LEN_ERR: u32 = 1;
/// Local QP operation error: a WQE the QP cannot execute (bad opcode, too many SGEs).
pub const WC_LOC_QP_OP_ERR: u32 = 2;
/// Local protection error: an lkey not valid for the access or PD.
pub const WC_LOC_PROT_ERR: u32 = 4;
/// The QP was in error: the WR was flushed, not executed.
pub const WC_WR_FLUSH_ERR: u32 = 5;
/// A WR_BIND_MW that could not bind: a bad window, MR, range, rights or key.
pub const WC_MW_BIND_ERR: u32 = 6;
/// The peer's response made no sense for the request.
pub const WC_BAD_RESP_ERR: u32 = 7;
/// Local access error: the receiving side's own buffer refused an incoming message.
pub const WC_LOC_ACCESS_ERR: u32 = 8;
/// The peer found the request invalid.
pub const WC_REM_INV_REQ_ERR: u32 = 9;
/// The peer refused the access (its rkey, range or rights).
pub const WC_REM_ACCESS_ERR: u32 = 10;
/// The peer could not execute the request.
pub const WC_REM_OP_ERR: u32 = 11;
/// Retries ran out with no ACK (or the peer's port is gone).
pub const WC_RETRY_EXC_ERR: u32 = 12;
/// RNR retries ran out: the peer never had a receive posted.
pub const WC_RNR_RETRY_EXC_ERR: u32 = 13;
/// Any other failure.
pub const WC_GENERAL_ERR: u32 = 21;

// ---- Event queue entries ------------------------------------------------------------------
/// A CQ that was armed got a CQE: `param` = CQN.
pub const EV_COMPLETION: u32 = 1;
/// A mailbox command finished: `param` = its seq, `data` = its status.
pub const EV_CMD_DONE: u32 = 2;
/// The port became ACTIVE.
pub const EV_PORT_ACTIVE: u32 = 3;
/// The port went DOWN.
pub const EV_PORT_DOWN: u32 = 4;
/// A CQ overflowed or its ring became unreachable: `param` = CQN, `data` = reason.
pub const EV_CQ_ERR: u32 = 5;
/// A QP hit a local catastrophic error (bad ring index, unreadable WQE): `param` = QPN.
pub const EV_QP_FATAL: u32 = 6;
/// A QP's responder saw an access violation (IB_EVENT_QP_ACCESS_ERR): `param` = QPN.
pub const EV_QP_ACCESS_ERR: u32 = 7;
/// An armed SRQ's posted WQEs fell below its limit (the limit is disarmed): `param` = SRQN.
pub const EV_SRQ_LIMIT: u32 = 8;
/// A QP on an SRQ entered ERR: it takes no more WQEs from the SRQ (IB's Last WQE Reached),
/// `param` = QPN.
pub const EV_QP_LAST_WQE: u32 = 9;
/// An SRQ's producer index or ring became unusable; the SRQ is in error and every QP that
/// next takes a WQE from it goes to ERR: `param` = SRQN, `data` = reason.
pub const EV_SRQ_ERR: u32 = 10;
/// The subnet manager changed the port's P_Key table (read it again with QUERY_PKEYS).
pub const EV_PKEY_CHANGE: u32 = 11;
/// A catastrophic error (`param` = syndrome, a `CATAS_*`): the port is down, every QP is in
/// ERR with its work flushed, and only teardown commands and RESET run until a RESET.
pub const EV_CATAS: u32 = 12;
/// A subnet manager changed the port (`CMD_SMP_SET`): `data` = `PORT_CHANGE_*` bits; read
/// it again with QUERY_PORT.
pub const EV_PORT_CHANGE: u32 = 13;
/// EV_PORT_CHANGE: the port's LID or LMC changed.
pub const PORT_CHANGE_LID: u32 = 1 << 0;
/// EV_PORT_CHANGE: the SM's LID or SL changed.
pub const PORT_CHANGE_SM: u32 = 1 << 1;
/// EV_PORT_CHANGE: the SM asks its clients to register again (ClientReregister).
pub const PORT_CHANGE_REREG: u32 = 1 << 2;

// Syndromes of EV_CATAS and HcaDevInfo::catas_syndrome.
/// Injected from the host (`hcabench fault NODE fatal`).
pub const CATAS_INJECTED: u32 = 1;
/// The function was reset underneath its driver (`hcabench fault NODE reset`): it holds
/// nothing the driver made, its EQs included (no event says so, only `catas_syndrome`),
/// flushed nothing, and runs only what `EV_CATAS` allows until a RESET.
pub const CATAS_RESET: u32 = 2;

// Reasons in `data` of EV_CQ_ERR / EV_QP_FATAL.
/// The CQ overflowed: the driver did not consume in time.
pub const ERR_CQ_OVERFLOW: u32 = 1;
/// The device could not read or write a ring.
pub const ERR_RING_ACCESS: u32 = 2;
/// A producer index moved more than the ring holds.
pub const ERR_WQ_INDEX: u32 = 3;

/// Marks a struct as a byte image of the ABI: plain integers, no padding (asserted by
/// `abi_struct!`'s size check against the hand-computed size).
macro_rules! abi_struct {
    ($name:ident, $size:expr) => {
        const _: () = assert!(std::mem::size_of::<$name>() == $size);
        const _: () = assert!(std::mem::align_of::<$name>() <= 8);
        // SAFETY: a repr(C) struct of integer fields whose size equals the sum of its fields
        // (the assertion above, with every field laid out below), so it has no padding and
        // every bit pattern is a valid value.
        unsafe impl ByteValued for $name {}
    };
}

/// BAR2 offset 0: identity, port and layout. Written by the device, read-only to the driver.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaDevInfo {
    /// [`SIGNATURE`]: an hcabench HCA.
    pub signature: u32,
    /// [`ABI_VERSION`] of the device.
    pub abi_version: u32,
    /// The port's LID (0 while it has none).
    pub lid: u16,
    /// `PORT_ACTIVE` or `PORT_DOWN`.
    pub port_state: u8,
    /// Doorbell classes and MSI-X vectors ([`NUM_VECTORS`]).
    pub num_vectors: u8,
    /// `CAP_*` bits.
    pub caps: u32,
    /// The node's (and port's) GUID.
    pub node_guid: u64,
    /// Where the command mailbox is in BAR2.
    pub mailbox_offset: u32,
    /// Where the EQ rings are in BAR2.
    pub eq_offset: u32,
    /// Where the EQ consumer-index records are in BAR2.
    pub eq_db_offset: u32,
    /// Where the QP doorbell records are in BAR2.
    pub qp_db_offset: u32,
    /// Where the CQ doorbell records are in BAR2.
    pub cq_db_offset: u32,
    /// Each EQ holds `1 << eq_log_entries` entries.
    pub eq_log_entries: u32,
    /// The device's ivshmem peer id: the `peer` field of every doorbell write.
    pub doorbell_peer: u32,
    /// Where SRQ doorbell records start (with CAP_SRQ; 0 without).
    pub srq_db_offset: u32,
    /// Nonzero (a `CATAS_*`) while the device is in a catastrophic error (with CAP_RESET).
    pub catas_syndrome: u32,
    /// Reserved; zero.
    pub rsvd0: u32,
    /// Reserved; zero.
    pub rsvd: [u64; 2],
}
abi_struct!(HcaDevInfo, 80);

/// The command mailbox at BAR2_MAILBOX_OFFSET. The driver fills `opcode`, `flags` and
/// `input`, then writes `seq` (a new value) and rings DB_CMD. The device writes `output` and
/// `status`, then sets `done_seq = seq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcaCmdMailbox {
    /// A `CMD_*` opcode.
    pub opcode: u32,
    /// `CMD_FLAG_*` bits.
    pub flags: u32,
    /// The driver's sequence number for this command; a new value starts it.
    pub seq: u32,
    /// The device sets it to `seq` when the command is done.
    pub done_seq: u32,
    /// A `CMD_*` status code, valid once `done_seq == seq`.
    pub status: u32,
    /// Reserved; zero.
    pub rsvd0: u32,
    /// Reserved; zero.
    pub rsvd1: u64,
    /// The command's input structure.
    pub input: [u8; 96],
    /// The command's output structure.
    pub output: [u8; 64],
    /// Reserved; zero.
    pub rsvd2: [u64; 8],
}
abi_struct!(HcaCmdMailbox, 256);

impl Default for HcaCmdMailbox {
    fn default() -> Self {
        Self {
            opcode: 0,
            flags: 0,
            seq: 0,
            done_seq: 0,
            status: 0,
            rsvd0: 0,
            rsvd1: 0,
            input: [0; 96],
            output: [0; 64],
            rsvd2: [0; 8],
        }
    }
}

/// QUERY_DEVICE output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaDeviceAttr {
    /// Firmware version (the model's version).
    pub fw_ver: u64,
    /// The node GUID.
    pub node_guid: u64,
    /// The largest MR, in bytes.
    pub max_mr_size: u64,
    /// Page sizes MRs may use, one bit per size.
    pub page_size_cap: u64,
    /// QPs the device holds at most ([`MAX_QP`]).
    pub max_qp: u32,
    /// WQEs per queue at most.
    pub max_qp_wr: u32,
    /// CQs the device holds at most ([`MAX_CQ`]).
    pub max_cq: u32,
    /// CQEs per CQ at most.
    pub max_cqe: u32,
    /// MRs the device holds at most ([`MAX_MR`]).
    pub max_mr: u32,
    /// PDs the device holds at most ([`MAX_PD`]).
    pub max_pd: u32,
    /// SGEs per WQE at most ([`MAX_SGE`]).
    pub max_sge: u16,
    /// Inline bytes per send WQE at most ([`MAX_INLINE`]).
    pub max_inline: u16,
    /// The reserved lkey ([`LOCAL_DMA_LKEY`]).
    pub local_dma_lkey: u32,
}
abi_struct!(HcaDeviceAttr, 64);

/// QUERY_PORT output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaPortAttr {
    /// The subnet prefix of the port's GID.
    pub gid_prefix: u64,
    /// The port GUID (the GID's interface ID).
    pub port_guid: u64,
    /// The port's LID.
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// A `PORT_*` state.
    pub state: u8,
    /// The largest MTU the port supports (`MTU_*`).
    pub max_mtu: u8,
    /// The MTU in use (`MTU_*`).
    pub active_mtu: u8,
    /// The LID mask control (always 0: one LID a port).
    pub lmc: u8,
    /// The port's M_Key (0: none).
    pub mkey: u64,
    /// M_KeyLeasePeriod, in seconds (0: forever).
    pub mkey_lease: u16,
    /// The SL of the subnet manager's paths (MasterSMSL).
    pub sm_sl: u8,
    /// M_KeyProtectBits (0..=[`MKEY_PROT_MAX`]).
    pub mkey_prot: u8,
    /// SubnetTimeOut (4.096 us * 2^n).
    pub subnet_timeout: u8,
    /// `PORT_FLAG_*` bits.
    pub flags: u8,
    /// Reserved; zero.
    pub rsvd1: u16,
    /// Reserved; zero.
    pub rsvd2: [u64; 3],
}
abi_struct!(HcaPortAttr, 64);

/// SMP_SET input: an SMP Set of the port's PortInfo or P_KeyTable, as it came (attribute
/// data big-endian, as on the wire, IBA 14.2.5).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcaCmdSmpSet {
    /// The attribute: PortInfo (0x0015) or P_KeyTable (0x0016).
    pub attr_id: u16,
    /// Reserved; zero.
    pub rsvd: u16,
    /// The SMP's AttributeModifier.
    pub attr_mod: u32,
    /// The SMP's M_Key.
    pub mkey: u64,
    /// The attribute's 64 bytes.
    pub data: [u8; 64],
}
abi_struct!(HcaCmdSmpSet, 80);

impl Default for HcaCmdSmpSet {
    fn default() -> Self {
        Self {
            attr_id: 0,
            rsvd: 0,
            attr_mod: 0,
            mkey: 0,
            data: [0; 64],
        }
    }
}

/// QUERY_PKEYS output: the port's P_Key table; entry 0 is the default partition's 0xffff,
/// an entry of 0 is empty. A QP's `pkey_index` names a non-empty entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaPKeyTable {
    /// The table's entries, by index.
    pub pkeys: [u16; PKEY_TABLE_LEN],
}
abi_struct!(HcaPKeyTable, 32);

/// QUERY_COUNTERS input: the index of the first counter wanted (a `CTR_*`), below
/// [`COUNTERS_LEN`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdCounters {
    /// The first `CTR_*` index wanted.
    pub first: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdCounters, 8);

/// QUERY_COUNTERS output: counters `first` to `first + 7` (0 past [`COUNTERS_LEN`]). Each
/// counts from the device's creation and never goes back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCounters {
    /// Counters `first` to `first + 7`.
    pub values: [u64; 8],
}
abi_struct!(HcaCounters, 64);

// ---- Port counters (QUERY_COUNTERS indices) -----------------------------------------------
/// MTU packets sent and received (every packet of a message; ACKs and MADs too).
pub const CTR_TX_PACKETS: u32 = 0;
/// MTU packets received.
pub const CTR_RX_PACKETS: u32 = 1;
/// Octets sent and received on the wire: headers, payload and CRCs (IBA's PortXmitData and
/// PortRcvData count these, in units of 4).
pub const CTR_TX_OCTETS: u32 = 2;
/// Octets received on the wire.
pub const CTR_RX_OCTETS: u32 = 3;
/// Of the packets, those to and from multicast groups.
pub const CTR_TX_MCAST_PACKETS: u32 = 4;
/// Multicast packets received.
pub const CTR_RX_MCAST_PACKETS: u32 = 5;
/// Packets the port could not send: no port has their destination LID.
pub const CTR_TX_DISCARDS: u32 = 6;
/// Times the port's link went down.
pub const CTR_LINK_DOWNED: u32 = 7;
/// Packets dropped on arrival for a bad ICRC.
pub const CTR_ICRC_ERRORS: u32 = 8;
/// Packets dropped on arrival for a P_Key outside the receiving QP's partition.
pub const CTR_PKEY_VIOLATIONS: u32 = 9;
/// Requests sent again (timeouts, sequence NAKs, RNR NAKs).
pub const CTR_RETRANSMITS: u32 = 10;
/// PSN sequence error NAKs and RNR NAKs received.
pub const CTR_SEQ_NAKS: u32 = 11;
/// RNR NAKs received.
pub const CTR_RNR_NAKS: u32 = 12;
/// Send WRs that ended in a retry-exceeded error.
pub const CTR_RETRY_EXCEEDED: u32 = 13;
/// Requests that arrived twice and were answered again.
pub const CTR_DUPLICATES: u32 = 14;
/// Datagrams dropped (no receive posted, bad Q_Key, too long, ...), and RC packets sent
/// that no receiver took.
pub const CTR_UD_DROPPED: u32 = 15;
/// RC packets sent that no receiver took.
pub const CTR_RC_DROPPED: u32 = 16;
/// Remote accesses stopped because their MR was deregistered or invalidated in flight.
pub const CTR_REVOKED: u32 = 17;
/// Read responses that arrived past a gap (the read was asked again).
pub const CTR_READ_GAPS: u32 = 18;
/// Device accesses to guest memory that failed (outside RAM, or a bad ring).
pub const CTR_DMA_FAULTS: u32 = 19;
/// CQEs and EQEs lost to a full queue.
pub const CTR_CQES_LOST: u32 = 20;
/// EQEs lost to a full EQ.
pub const CTR_EVENTS_LOST: u32 = 21;
/// How many counters there are.
pub const COUNTERS_LEN: u32 = 22;
/// The counters' names, in `CTR_*` order: hca_ib's hardware counters
/// (`/sys/class/infiniband/hcab0/ports/1/hw_counters/`) carry the same.
pub const COUNTER_NAMES: [&str; COUNTERS_LEN as usize] = [
    "tx_packets",
    "rx_packets",
    "tx_octets",
    "rx_octets",
    "tx_mcast_packets",
    "rx_mcast_packets",
    "tx_discards",
    "link_downed",
    "icrc_errors",
    "pkey_violations",
    "retransmits",
    "seq_naks_received",
    "rnr_naks_received",
    "retry_exceeded",
    "duplicate_requests",
    "ud_dropped",
    "rc_dropped",
    "revoked_accesses",
    "read_gaps",
    "dma_faults",
    "cqes_lost",
    "events_lost",
];

/// Entries in a port's P_Key table.
pub const PKEY_TABLE_LEN: usize = crate::partition::PKEY_TABLE_LEN;

/// ATTACH_MCAST / DETACH_MCAST input: QP `qpn` (UD) and the group's MGID and MLID.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdMcast {
    /// The group's MGID.
    pub mgid: [u8; 16],
    /// The UD QP.
    pub qpn: u32,
    /// The group's multicast LID.
    pub mlid: u16,
    /// Reserved; zero.
    pub rsvd: u16,
}
abi_struct!(HcaCmdMcast, 24);

/// SET_PORT_CAP input: the port's PortInfo:CapabilityMask, as its driver advertises it
/// (ib_modify_port); the subnet administrator's PortInfoRecords show it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdPortCap {
    /// PortInfo:CapabilityMask.
    pub cap_mask: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdPortCap, 8);

/// Input (ALLOC_PD output, DEALLOC_PD/DEREG_MR/DESTROY_* input, CREATE_* output): one handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdHandle {
    /// The PDN, key, CQN, QPN or SRQN.
    pub handle: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdHandle, 8);

/// REG_MR input. A page-list MR maps byte `iova + k` to
/// `page_list[(fbo + k) >> page_shift] + ((fbo + k) & (page_size - 1))`, fbo = iova & (page_size - 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdRegMr {
    /// The MR's first I/O virtual address.
    pub iova: u64,
    /// The MR's length in bytes.
    pub length: u64,
    /// Guest-physical address of the page list (`npages` u64 page addresses).
    pub page_list: u64,
    /// The PD the MR belongs to.
    pub pdn: u32,
    /// `ACCESS_*` bits.
    pub access: u32,
    /// Pages in the page list; for a fast-registration MR, the most it may map.
    pub npages: u32,
    /// The page size, as a shift.
    pub page_shift: u32,
    /// `MR_FLAG_*` bits.
    pub flags: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdRegMr, 48);

/// CREATE_CQ input; the ring holds `1 << log_entries` HcaCqe and must be zeroed by nobody:
/// the device zeroes it at creation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdCreateCq {
    /// Guest-physical address of the CQE ring.
    pub ring_addr: u64,
    /// The ring holds `1 << log_entries` CQEs.
    pub log_entries: u32,
    /// The completion vector its events go to (`VEC_COMP_FIRST` up).
    pub vector: u32,
    /// With CAP_UAR: where in BAR2's user access regions its doorbell record is (8-byte
    /// aligned); 0: at `BAR2_CQ_DB_OFFSET + 8 * CQN`.
    pub db_offset: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdCreateCq, 24);

/// RESIZE_CQ input: CQ `cqn` goes on to the ring at `ring_addr` of `1 << log_entries`
/// HcaCqe. The device zeroes the new ring, moves the CQEs the driver has not consumed (by
/// the consumer index in the CQ's doorbell record) to its first slots in order, and sets the
/// record's consumer index to 0: the driver, holding its CQ's lock across the command,
/// polls on from index 0 of the new ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdResizeCq {
    /// Guest-physical address of the new ring.
    pub ring_addr: u64,
    /// The CQ to move.
    pub cqn: u32,
    /// The new ring holds `1 << log_entries` CQEs.
    pub log_entries: u32,
}
abi_struct!(HcaCmdResizeCq, 16);

/// ALLOC_PD input (all zero: a kernel PD).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdAllocPd {
    /// `PD_FLAG_*` bits.
    pub flags: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaCmdAllocPd, 8);

/// CREATE_QP input. Each ring holds `1 << log_entries` WQEs of `1 << wqe_shift` bytes.
/// A GSI QP always gets QPN 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdCreateQp {
    /// Guest-physical address of the send queue ring.
    pub sq_addr: u64,
    /// Guest-physical address of the receive queue ring.
    pub rq_addr: u64,
    /// The PD whose MRs the QP's WQEs may use.
    pub pdn: u32,
    /// The CQ send completions go to.
    pub send_cqn: u32,
    /// The CQ receive completions go to.
    pub recv_cqn: u32,
    /// A `QPT_*` type.
    pub qp_type: u32,
    /// `QP_FLAG_*` bits.
    pub flags: u32,
    /// The send queue holds `1 << sq_log_entries` WQEs.
    pub sq_log_entries: u8,
    /// Each send WQE is `1 << sq_wqe_shift` bytes.
    pub sq_wqe_shift: u8,
    /// The receive queue holds `1 << rq_log_entries` WQEs.
    pub rq_log_entries: u8,
    /// Each receive WQE is `1 << rq_wqe_shift` bytes.
    pub rq_wqe_shift: u8,
    /// With QP_FLAG_SRQ: the SRQ its receives come from (the rq_* fields are then unused).
    pub srqn: u32,
    /// With CAP_UAR: where in BAR2's user access regions its doorbell record is; 0: at
    /// `BAR2_QP_DB_OFFSET + 8 * QPN`.
    pub db_offset: u32,
}
abi_struct!(HcaCmdCreateQp, 48);

/// QP attributes, as MODIFY_QP input and QUERY_QP output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaQpAttr {
    /// The Q_Key datagrams to this QP must carry (UD).
    pub qkey: u32,
    /// The PSN the responder expects next.
    pub rq_psn: u32,
    /// The PSN the requester sends next.
    pub sq_psn: u32,
    /// The peer QP (RC).
    pub dest_qpn: u32,
    /// `ACCESS_*` bits: what a peer may do through this QP.
    pub access_flags: u32,
    /// The P_Key table entry of the QP's partition.
    pub pkey_index: u16,
    /// The peer port's LID (RC).
    pub dlid: u16,
    /// A `QPS_*` state.
    pub state: u8,
    /// The state the driver believes the QP is in (`QP_ATTR_CUR_STATE`).
    pub cur_state: u8,
    /// The path MTU (`MTU_*`).
    pub path_mtu: u8,
    /// The port (always 1).
    pub port_num: u8,
    /// Local ACK timeout: 4.096 us * 2^timeout (0: never times out).
    pub timeout: u8,
    /// Retries after a timeout or sequence NAK before the WR fails.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK before the WR fails (7: without end).
    pub rnr_retry: u8,
    /// The RNR NAK timer code this QP's responder sends.
    pub min_rnr_timer: u8,
    /// READs and atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// READs and atomics this QP answers at once.
    pub max_dest_rd_atomic: u8,
    /// Service level.
    pub sl: u8,
    /// A `QPT_*` type (QUERY_QP output).
    pub qp_type: u8,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaQpAttr, 40);

/// MODIFY_QP input.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdModifyQp {
    /// The QP to modify.
    pub qpn: u32,
    /// `QP_ATTR_*` bits: which fields of `attr` apply.
    pub attr_mask: u32,
    /// The attributes.
    pub attr: HcaQpAttr,
}
abi_struct!(HcaCmdModifyQp, 48);

/// CREATE_SRQ input. The ring holds `1 << log_entries` receive WQEs of `1 << wqe_shift`
/// bytes, whose SGEs' lkeys belong to PD `pdn`; `limit` arms the limit event at once (0:
/// not armed).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdCreateSrq {
    /// Guest-physical address of the WQE ring.
    pub ring_addr: u64,
    /// The PD whose MRs the SRQ's WQEs may use.
    pub pdn: u32,
    /// The limit event's threshold (0: not armed).
    pub limit: u32,
    /// The ring holds `1 << log_entries` WQEs.
    pub log_entries: u8,
    /// Each WQE is `1 << wqe_shift` bytes.
    pub wqe_shift: u8,
    /// Reserved; zero.
    pub rsvd0: u16,
    /// With CAP_UAR: where in BAR2's user access regions its doorbell record is; 0: at
    /// `BAR2_SRQ_DB_OFFSET + 8 * SRQN`.
    pub db_offset: u32,
}
abi_struct!(HcaCmdCreateSrq, 24);

/// MODIFY_SRQ input and QUERY_SRQ output: the SRQ's limit (0: not armed; the event
/// disarms it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdSrqLimit {
    /// The SRQ.
    pub srqn: u32,
    /// The limit (0: not armed).
    pub limit: u32,
}
abi_struct!(HcaCmdSrqLimit, 8);

/// SRQ doorbell record (BAR2_SRQ_DB_OFFSET + 8 * SRQN): the free-running producer index.
/// Posting needs no doorbell: the device reads it when a message needs a receive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaSrqDb {
    /// The SRQ's free-running producer index.
    pub pi: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}
abi_struct!(HcaSrqDb, 8);

/// QP doorbell record (BAR2_QP_DB_OFFSET + 8 * QPN): free-running producer indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaQpDb {
    /// The send queue's free-running producer index.
    pub sq_pi: u32,
    /// The receive queue's free-running producer index.
    pub rq_pi: u32,
}
abi_struct!(HcaQpDb, 8);

/// CQ doorbell record (BAR2_CQ_DB_OFFSET + 8 * CQN). `ci` is the driver's free-running
/// consumer index; `arm` = `(sn << 1) | solicited_only`, a new sn arms the CQ once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCqDb {
    /// The driver's free-running consumer index.
    pub ci: u32,
    /// `(sn << 1) | solicited_only`: a new sn arms the CQ once.
    pub arm: u32,
}
abi_struct!(HcaCqDb, 8);

/// Scatter/gather element, in send and receive WQEs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaSge {
    /// Start address (I/O virtual, in the MR `lkey` names).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The MR's local key.
    pub lkey: u32,
}
abi_struct!(HcaSge, 16);

/// Send WQE header; `num_sge` HcaSge or `inline_len` bytes of inline data follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaSendWqe {
    /// The driver's tag for the WR, returned in its CQE.
    pub wr_id: u64,
    /// A `WR_*` opcode.
    pub opcode: u8,
    /// `WQE_*` bits.
    pub flags: u8,
    /// SGEs that follow the header.
    pub num_sge: u8,
    /// Reserved; zero.
    pub rsvd0: u8,
    /// Immediate data, or the rkey to invalidate (SEND with Invalidate, LOCAL_INV).
    pub imm: u32,
    /// The peer's address (RDMA and atomics).
    pub remote_addr: u64,
    /// The peer's MR key (RDMA and atomics).
    pub rkey: u32,
    /// Inline bytes that follow the header (with WQE_INLINE).
    pub inline_len: u32,
    /// UD: the destination QP.
    pub ud_remote_qpn: u32,
    /// UD: the destination's Q_Key.
    pub ud_qkey: u32,
    /// UD: the destination LID.
    pub ud_dlid: u16,
    /// QP1 only: the entry of the port's P_Key table the datagram's P_Key is (a MAD in a
    /// partition, as ib_ud_wr's pkey_index); other QPs send with their own P_Key.
    pub ud_pkey_index: u16,
    /// Reserved; zero.
    pub rsvd2: u32,
    /// Atomics: the compare value (CMP_SWP) or addend (FETCH_ADD).
    pub compare_add: u64,
    /// Atomics: the swap value (CMP_SWP).
    pub swap: u64,
}
abi_struct!(HcaSendWqe, 64);

/// A send-queue WQE with opcode `WR_REG_MR`: maps the fast-registration MR `key >> 8` (in
/// the QP's PD) to `[iova, iova + length)` over the page list at `page_list` (guest-physical
/// `u64` page addresses, as for REG_MR), with `access`, and makes `key` its key (its low 8
/// bits are the new tag; the key may not be `LOCAL_DMA_LKEY`). `wr_id`, `opcode` and `flags` sit
/// where a send WQE has them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaRegMrWqe {
    /// The driver's tag for the WR, returned in its CQE.
    pub wr_id: u64,
    /// `WR_REG_MR`.
    pub opcode: u8,
    /// `WQE_*` bits.
    pub flags: u8,
    /// Reserved; zero.
    pub rsvd0: u16,
    /// `ACCESS_*` bits the MR gets.
    pub access: u32,
    /// The MR's first I/O virtual address.
    pub iova: u64,
    /// The MR's new key.
    pub key: u32,
    /// Pages in the page list.
    pub npages: u32,
    /// The MR's length in bytes.
    pub length: u64,
    /// Guest-physical address of the page list.
    pub page_list: u64,
    /// The page size, as a shift.
    pub page_shift: u32,
    /// Reserved; zero.
    pub rsvd1: u32,
    /// Reserved; zero.
    pub rsvd2: u64,
}
abi_struct!(HcaRegMrWqe, 64);

/// A send-queue WQE with opcode `WR_BIND_MW`: binds the memory window `mw_key >> 8` (in the
/// QP's PD) to `[addr, addr + length)` of the MR whose key is `mr_key` (same PD, with
/// `ACCESS_MW_BIND`, the range inside it), granting the remote rights in `access`, and
/// makes `new_key` its key (the same window index, a new tag). A type 2 window must be
/// unbound and is bound to this QP; a type 1 window with `length` 0 is unbound. `wr_id`,
/// `opcode` and `flags` sit where a send WQE has them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaBindMwWqe {
    /// The driver's tag for the WR, returned in its CQE.
    pub wr_id: u64,
    /// `WR_BIND_MW`.
    pub opcode: u8,
    /// `WQE_*` bits.
    pub flags: u8,
    /// Reserved; zero.
    pub rsvd0: u16,
    /// `ACCESS_*` remote rights the window grants.
    pub access: u32,
    /// The window's first address (inside the MR).
    pub addr: u64,
    /// The window's length in bytes (0 unbinds a type 1 window).
    pub length: u64,
    /// The window's current key.
    pub mw_key: u32,
    /// The key the window gets: the same index, a new tag.
    pub new_key: u32,
    /// The key of the MR the window opens onto.
    pub mr_key: u32,
    /// Reserved; zero.
    pub rsvd1: u32,
    /// Reserved; zero.
    pub rsvd2: [u64; 2],
}
abi_struct!(HcaBindMwWqe, 64);

/// ALLOC_MW input: a window of `mw_type` (`MW_TYPE_1` or `MW_TYPE_2`) in PD `pdn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCmdAllocMw {
    /// The PD the window belongs to.
    pub pdn: u32,
    /// `MW_TYPE_1` or `MW_TYPE_2`.
    pub mw_type: u32,
}
abi_struct!(HcaCmdAllocMw, 8);

/// A send-queue WQE with opcode `WR_MASKED_CMP_SWP` or `WR_MASKED_FETCH_ADD`: a send WQE
/// whose UD fields (unused by an RC atomic) carry the two masks. `num_sge` SGEs (one
/// 8-byte result buffer) follow it, as for an atomic.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaMaskedAtomicWqe {
    /// The driver's tag for the WR, returned in its CQE.
    pub wr_id: u64,
    /// `WR_MASKED_CMP_SWP` or `WR_MASKED_FETCH_ADD`.
    pub opcode: u8,
    /// `WQE_*` bits.
    pub flags: u8,
    /// SGEs that follow the header (the result buffer).
    pub num_sge: u8,
    /// Reserved; zero.
    pub rsvd0: u8,
    /// Reserved; zero.
    pub rsvd1: u32,
    /// The peer's address.
    pub remote_addr: u64,
    /// The peer's MR key.
    pub rkey: u32,
    /// Reserved; zero.
    pub rsvd2: u32,
    /// CMP_SWP: the bits compared; FETCH_ADD: the fields' top bits.
    pub compare_add_mask: u64,
    /// CMP_SWP: the bits swapped; FETCH_ADD: unused.
    pub swap_mask: u64,
    /// CMP_SWP: the value compared with; FETCH_ADD: what is added.
    pub compare_add: u64,
    /// CMP_SWP: the value swapped in; FETCH_ADD: unused.
    pub swap: u64,
}
abi_struct!(HcaMaskedAtomicWqe, 64);

/// Receive WQE header; `num_sge` HcaSge follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaRecvWqe {
    /// The driver's tag for the receive, returned in its CQE.
    pub wr_id: u64,
    /// SGEs that follow the header.
    pub num_sge: u8,
    /// Reserved; zero.
    pub rsvd: [u8; 7],
}
abi_struct!(HcaRecvWqe, 16);

/// Completion queue entry. The device writes it whole, then `owner` last; an entry is valid
/// when `owner == ((index >> log_entries) & 1) ^ 1` (first lap 1, second lap 0, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaCqe {
    /// The `wr_id` of the WQE it completes.
    pub wr_id: u64,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data or the invalidated rkey (see `flags`).
    pub imm: u32,
    /// The QP the WQE belonged to.
    pub qpn: u32,
    /// UD receives: the sender's QPN.
    pub src_qp: u32,
    /// UD receives: the sender's LID.
    pub slid: u16,
    /// A `CQE_OP_*` opcode.
    pub opcode: u8,
    /// A `WC_*` status.
    pub status: u8,
    /// `CQE_FLAG_*` bits.
    pub flags: u8,
    /// The ownership bit, written last (see [`owner_bit`]).
    pub owner: u8,
    /// The P_Key table entry of the partition the message came in (QP0 and QP1: the entry its P_Key matched).
    pub pkey_index: u16,
}
abi_struct!(HcaCqe, 32);

/// Event queue entry; same ownership rule as HcaCqe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaEqe {
    /// An `EV_*` type.
    pub event_type: u8,
    /// The ownership bit, written last (see [`owner_bit`]).
    pub owner: u8,
    /// Reserved; zero.
    pub rsvd0: u16,
    /// The event's object (CQN, QPN, SRQN, command seq).
    pub param: u32,
    /// The event's detail (a reason, a command status).
    pub data: u32,
    /// Reserved; zero.
    pub rsvd1: u32,
}
abi_struct!(HcaEqe, 16);

// The BAR2 regions fit and do not overlap; the largest WQE strides hold the most SGEs and
// inline bytes the device accepts. Checked when the crate builds.
const _: () = {
    assert!(BAR2_MAILBOX_OFFSET + 256 <= BAR2_EQ_DB_OFFSET);
    assert!(BAR2_EQ_DB_OFFSET + NUM_VECTORS * EQ_DB_STRIDE <= BAR2_EQ_OFFSET);
    assert!(BAR2_EQ_OFFSET + NUM_VECTORS * EQ_ENTRIES * 16 <= BAR2_QP_DB_OFFSET);
    assert!(BAR2_QP_DB_OFFSET + MAX_QP * 8 <= BAR2_CQ_DB_OFFSET);
    assert!(BAR2_CQ_DB_OFFSET + MAX_CQ * 8 <= BAR2_SRQ_DB_OFFSET);
    assert!(BAR2_SRQ_DB_OFFSET + MAX_SRQ * 8 <= BAR2_SQ_RING_OFFSET);
    assert!(BAR2_SQ_RING_OFFSET + SQ_RINGS * SQ_RING_STRIDE <= BAR2_UAR_OFFSET);
    assert!(SQ_RING_PI + 4 <= SQ_RINGS_USED);
    assert!(SQ_RINGS_USED + 4 <= SQ_RING_QPN_OFFSET);
    assert!(SQ_RING_QPN_OFFSET + SQ_RING_ENTRIES * 4 <= SQ_RING_STRIDE);
    assert!(SQ_RING_ENTRIES.is_power_of_two());
    assert!(BAR2_UAR_OFFSET + MAX_UAR * UAR_SIZE == BAR2_SIZE);
    assert!(BAR2_SIZE.is_power_of_two());
    assert!(64 + MAX_SGE * 16 <= 1 << MAX_SQ_WQE_SHIFT);
    assert!(64 + MAX_INLINE <= 1 << MAX_SQ_WQE_SHIFT);
    assert!(16 + MAX_SGE * 16 <= 1 << MAX_RQ_WQE_SHIFT);
};

/// Offsets of `owner` bytes, written last with release ordering.
pub const CQE_OWNER_OFFSET: u32 = std::mem::offset_of!(HcaCqe, owner) as u32;
/// Where an EQE's `owner` byte is.
pub const EQE_OWNER_OFFSET: u32 = std::mem::offset_of!(HcaEqe, owner) as u32;

/// The owner bit a producer writes into the entry at free-running index `index`.
pub fn owner_bit(index: u32, log_entries: u32) -> u8 {
    (((index >> log_entries) & 1) ^ 1) as u8
}

/// Every constant, struct size and field offset of the ABI under its C name, for the
/// C/Rust agreement test. Keys: `HCA_NAME` for constants, `struct.size`, `struct.field` (its
/// offset) and `struct.field.width` (its size).
pub fn layout() -> Vec<(String, u64)> {
    let mut t: Vec<(String, u64)> = Vec::new();
    macro_rules! consts {
        ($($c:ident),* $(,)?) => { $( t.push((concat!("HCA_", stringify!($c)).into(), $c as u64)); )* };
    }
    macro_rules! layout_of {
        ($s:ident => $c:literal { $($f:ident),* $(,)? }) => {
            t.push((concat!($c, ".size").into(), std::mem::size_of::<$s>() as u64));
            $(
                t.push((concat!($c, ".", stringify!($f)).into(), std::mem::offset_of!($s, $f) as u64));
                t.push((
                    concat!($c, ".", stringify!($f), ".width").into(),
                    std::mem::size_of_val(&<$s as Default>::default().$f) as u64,
                ));
            )*
        };
    }
    consts!(
        ABI_VERSION,
        SIGNATURE,
        PCI_VENDOR_IVSHMEM,
        PCI_DEVICE_IVSHMEM,
        PCI_VENDOR_HCABENCH,
        PCI_DEVICE_HCABENCH,
        BAR0_INTR_MASK,
        BAR0_INTR_STATUS,
        BAR0_IV_POSITION,
        BAR0_DOORBELL,
        DOORBELL_PEER_SHIFT,
        DB_CMD,
        DB_SQ,
        DB_RQ,
        DB_CQ_ARM,
        NUM_VECTORS,
        VEC_ASYNC,
        VEC_COMP_FIRST,
        BAR2_SIZE,
        BAR2_INFO_OFFSET,
        BAR2_MAILBOX_OFFSET,
        BAR2_EQ_DB_OFFSET,
        EQ_DB_STRIDE,
        BAR2_EQ_OFFSET,
        EQ_LOG_ENTRIES,
        EQ_ENTRIES,
        BAR2_QP_DB_OFFSET,
        BAR2_CQ_DB_OFFSET,
        BAR2_SRQ_DB_OFFSET,
        BAR2_SQ_RING_OFFSET,
        SQ_RING_STRIDE,
        SQ_RINGS,
        SQ_RING_PI,
        SQ_RINGS_USED,
        SQ_RING_QPN_OFFSET,
        SQ_RING_ENTRIES,
        BAR2_UAR_OFFSET,
        UAR_SIZE,
        MAX_UAR,
        MAX_QP,
        MAX_CQ,
        MAX_SRQ,
        MAX_SRQ_LOG_WR,
        PKEY_TABLE_LEN,
        MAX_PD,
        MAX_MR,
        MAX_QP_LOG_WR,
        MAX_CQ_LOG_CQE,
        MAX_SGE,
        MAX_INLINE,
        MIN_SQ_WQE_SHIFT,
        MAX_SQ_WQE_SHIFT,
        MIN_RQ_WQE_SHIFT,
        MAX_RQ_WQE_SHIFT,
        MAX_MR_PAGES,
        MAX_TOTAL_MR_PAGES,
        MIN_MR_PAGE_SHIFT,
        MAX_MR_PAGE_SHIFT,
        MAX_MSG_SIZE,
        LOCAL_DMA_LKEY,
        UD_GRH_BYTES,
        MCAST_LID_FIRST,
        MAX_MCAST_ATTACH,
        GSI_QPN,
        GSI_QKEY,
        SMI_QPN,
        CAP_RC,
        CAP_UD,
        CAP_RDMA_READ,
        CAP_ATOMIC,
        CAP_MASKED_ATOMIC,
        CAP_SRQ,
        CAP_UAR,
        CAP_SQ_RING,
        CAP_MW_UC,
        CAP_RESET,
        CAP_LOCAL_DMA_LKEY,
        PORT_DOWN,
        PORT_INIT,
        PORT_ARMED,
        PORT_FLAG_GUEST_SM,
        PORT_ACTIVE,
        MTU_256,
        MTU_4096,
        CMD_QUERY_DEVICE,
        CMD_QUERY_PORT,
        CMD_QUERY_PKEYS,
        CMD_QUERY_COUNTERS,
        CMD_RESET,
        CTR_TX_PACKETS,
        CTR_RX_PACKETS,
        CTR_TX_OCTETS,
        CTR_RX_OCTETS,
        CTR_TX_MCAST_PACKETS,
        CTR_RX_MCAST_PACKETS,
        CTR_TX_DISCARDS,
        CTR_LINK_DOWNED,
        CTR_ICRC_ERRORS,
        CTR_PKEY_VIOLATIONS,
        CTR_RETRANSMITS,
        CTR_SEQ_NAKS,
        CTR_RNR_NAKS,
        CTR_RETRY_EXCEEDED,
        CTR_DUPLICATES,
        CTR_UD_DROPPED,
        CTR_RC_DROPPED,
        CTR_REVOKED,
        CTR_READ_GAPS,
        CTR_DMA_FAULTS,
        CTR_CQES_LOST,
        CTR_EVENTS_LOST,
        COUNTERS_LEN,
        CMD_ALLOC_PD,
        CMD_DEALLOC_PD,
        CMD_REG_MR,
        CMD_DEREG_MR,
        CMD_ALLOC_MW,
        CMD_DEALLOC_MW,
        CMD_CREATE_CQ,
        CMD_DESTROY_CQ,
        CMD_RESIZE_CQ,
        CMD_CREATE_QP,
        CMD_MODIFY_QP,
        CMD_QUERY_QP,
        CMD_DESTROY_QP,
        CMD_ATTACH_MCAST,
        CMD_DETACH_MCAST,
        CMD_SET_PORT_CAP,
        CMD_SMP_SET,
        CMD_CREATE_SRQ,
        CMD_MODIFY_SRQ,
        CMD_QUERY_SRQ,
        CMD_DESTROY_SRQ,
        CMD_FLAG_EVENT,
        CMD_OK,
        CMD_BAD_OPCODE,
        CMD_BAD_PARAM,
        CMD_BAD_HANDLE,
        CMD_BAD_STATE,
        CMD_BUSY,
        CMD_NO_RESOURCES,
        CMD_BAD_ADDRESS,
        CMD_FATAL,
        CMD_BAD_KEY,
        MR_FLAG_PHYS,
        MR_FLAG_FAST_REG,
        PD_FLAG_USER,
        ACCESS_LOCAL_WRITE,
        ACCESS_REMOTE_WRITE,
        ACCESS_REMOTE_READ,
        ACCESS_REMOTE_ATOMIC,
        ACCESS_MW_BIND,
        MW_TYPE_1,
        MW_TYPE_2,
        QPT_SMI,
        QPT_GSI,
        QPT_RC,
        QPT_UC,
        QPT_UD,
        QP_FLAG_SIG_ALL,
        QP_FLAG_SRQ,
        QP_FLAG_SQ_RING,
        QPS_RESET,
        QPS_INIT,
        QPS_RTR,
        QPS_RTS,
        QPS_SQD,
        QPS_SQE,
        QPS_ERR,
        QP_ATTR_STATE,
        QP_ATTR_CUR_STATE,
        QP_ATTR_ACCESS_FLAGS,
        QP_ATTR_PKEY_INDEX,
        QP_ATTR_PORT,
        QP_ATTR_QKEY,
        QP_ATTR_AV,
        QP_ATTR_PATH_MTU,
        QP_ATTR_TIMEOUT,
        QP_ATTR_RETRY_CNT,
        QP_ATTR_RNR_RETRY,
        QP_ATTR_RQ_PSN,
        QP_ATTR_MAX_QP_RD_ATOMIC,
        QP_ATTR_MIN_RNR_TIMER,
        QP_ATTR_SQ_PSN,
        QP_ATTR_MAX_DEST_RD_ATOMIC,
        QP_ATTR_DEST_QPN,
        WR_SEND,
        WR_SEND_IMM,
        WR_RDMA_WRITE,
        WR_RDMA_WRITE_IMM,
        WR_RDMA_READ,
        WR_ATOMIC_CMP_SWP,
        WR_ATOMIC_FETCH_ADD,
        WR_REG_MR,
        WR_LOCAL_INV,
        WR_SEND_INV,
        WR_MASKED_CMP_SWP,
        WR_MASKED_FETCH_ADD,
        WR_BIND_MW,
        WR_ATOMIC_WRITE,
        WQE_SIGNALED,
        WQE_SOLICITED,
        WQE_INLINE,
        WQE_FENCE,
        CQE_OP_SEND,
        CQE_OP_RDMA_WRITE,
        CQE_OP_RDMA_READ,
        CQE_OP_COMP_SWAP,
        CQE_OP_FETCH_ADD,
        CQE_OP_BIND_MW,
        CQE_OP_LOCAL_INV,
        CQE_OP_REG_MR,
        CQE_OP_MASKED_COMP_SWAP,
        CQE_OP_MASKED_FETCH_ADD,
        CQE_OP_ATOMIC_WRITE,
        CQE_OP_RECV,
        CQE_OP_RECV_RDMA_IMM,
        CQE_FLAG_IMM,
        CQE_FLAG_GRH,
        CQE_FLAG_INV,
        WC_SUCCESS,
        WC_LOC_LEN_ERR,
        WC_LOC_QP_OP_ERR,
        WC_LOC_PROT_ERR,
        WC_WR_FLUSH_ERR,
        WC_MW_BIND_ERR,
        WC_BAD_RESP_ERR,
        WC_LOC_ACCESS_ERR,
        WC_REM_INV_REQ_ERR,
        WC_REM_ACCESS_ERR,
        WC_REM_OP_ERR,
        WC_RETRY_EXC_ERR,
        WC_RNR_RETRY_EXC_ERR,
        WC_GENERAL_ERR,
        EV_COMPLETION,
        EV_CMD_DONE,
        EV_PORT_ACTIVE,
        EV_PORT_DOWN,
        EV_CQ_ERR,
        EV_QP_FATAL,
        EV_QP_ACCESS_ERR,
        EV_SRQ_LIMIT,
        EV_QP_LAST_WQE,
        EV_SRQ_ERR,
        EV_PKEY_CHANGE,
        EV_CATAS,
        EV_PORT_CHANGE,
        PORT_CHANGE_LID,
        PORT_CHANGE_SM,
        PORT_CHANGE_REREG,
        CATAS_INJECTED,
        CATAS_RESET,
        ERR_CQ_OVERFLOW,
        ERR_RING_ACCESS,
        ERR_WQ_INDEX,
        CQE_OWNER_OFFSET,
        EQE_OWNER_OFFSET,
    );
    layout_of!(HcaDevInfo => "hca_dev_info" { signature, abi_version, lid, port_state,
        num_vectors, caps, node_guid, mailbox_offset, eq_offset, eq_db_offset, qp_db_offset,
        cq_db_offset, eq_log_entries, doorbell_peer, srq_db_offset, catas_syndrome, rsvd0, rsvd });
    layout_of!(HcaCmdMailbox => "hca_cmd_mailbox" { opcode, flags, seq, done_seq, status,
        rsvd0, rsvd1, input, output, rsvd2 });
    layout_of!(HcaDeviceAttr => "hca_device_attr" { fw_ver, node_guid, max_mr_size,
        page_size_cap, max_qp, max_qp_wr, max_cq, max_cqe, max_mr, max_pd, max_sge,
        max_inline, local_dma_lkey });
    layout_of!(HcaPortAttr => "hca_port_attr" { gid_prefix, port_guid, lid, sm_lid, state,
        max_mtu, active_mtu, lmc, mkey, mkey_lease, sm_sl, mkey_prot, subnet_timeout, flags,
        rsvd1, rsvd2 });
    layout_of!(HcaCmdSmpSet => "hca_cmd_smp_set" { attr_id, rsvd, attr_mod, mkey, data });
    layout_of!(HcaCmdHandle => "hca_cmd_handle" { handle, rsvd });
    layout_of!(HcaCmdMcast => "hca_cmd_mcast" { mgid, qpn, mlid, rsvd });
    layout_of!(HcaPKeyTable => "hca_pkey_table" { pkeys });
    layout_of!(HcaCmdCounters => "hca_cmd_counters" { first, rsvd });
    layout_of!(HcaCounters => "hca_counters" { values });
    layout_of!(HcaCmdPortCap => "hca_cmd_port_cap" { cap_mask, rsvd });
    layout_of!(HcaCmdRegMr => "hca_cmd_reg_mr" { iova, length, page_list, pdn, access,
        npages, page_shift, flags, rsvd });
    layout_of!(HcaCmdCreateCq => "hca_cmd_create_cq" { ring_addr, log_entries, vector,
        db_offset, rsvd });
    layout_of!(HcaCmdResizeCq => "hca_cmd_resize_cq" { ring_addr, cqn, log_entries });
    layout_of!(HcaCmdAllocPd => "hca_cmd_alloc_pd" { flags, rsvd });
    layout_of!(HcaCmdCreateQp => "hca_cmd_create_qp" { sq_addr, rq_addr, pdn, send_cqn,
        recv_cqn, qp_type, flags, sq_log_entries, sq_wqe_shift, rq_log_entries,
        rq_wqe_shift, srqn, db_offset });
    layout_of!(HcaCmdCreateSrq => "hca_cmd_create_srq" { ring_addr, pdn, limit, log_entries,
        wqe_shift, rsvd0, db_offset });
    layout_of!(HcaCmdSrqLimit => "hca_cmd_srq_limit" { srqn, limit });
    layout_of!(HcaSrqDb => "hca_srq_db" { pi, rsvd });
    layout_of!(HcaQpAttr => "hca_qp_attr" { qkey, rq_psn, sq_psn, dest_qpn, access_flags,
        pkey_index, dlid, state, cur_state, path_mtu, port_num, timeout, retry_cnt,
        rnr_retry, min_rnr_timer, max_rd_atomic, max_dest_rd_atomic, sl, qp_type, rsvd });
    layout_of!(HcaCmdModifyQp => "hca_cmd_modify_qp" { qpn, attr_mask, attr });
    layout_of!(HcaQpDb => "hca_qp_db" { sq_pi, rq_pi });
    layout_of!(HcaCqDb => "hca_cq_db" { ci, arm });
    layout_of!(HcaSge => "hca_sge" { addr, length, lkey });
    layout_of!(HcaSendWqe => "hca_send_wqe" { wr_id, opcode, flags, num_sge, rsvd0, imm,
        remote_addr, rkey, inline_len, ud_remote_qpn, ud_qkey, ud_dlid, ud_pkey_index, rsvd2,
        compare_add, swap });
    layout_of!(HcaRegMrWqe => "hca_reg_mr_wqe" { wr_id, opcode, flags, rsvd0, access, iova,
        key, npages, length, page_list, page_shift, rsvd1, rsvd2 });
    layout_of!(HcaBindMwWqe => "hca_bind_mw_wqe" { wr_id, opcode, flags, rsvd0, access,
        addr, length, mw_key, new_key, mr_key, rsvd1, rsvd2 });
    layout_of!(HcaCmdAllocMw => "hca_cmd_alloc_mw" { pdn, mw_type });
    layout_of!(HcaMaskedAtomicWqe => "hca_masked_atomic_wqe" { wr_id, opcode, flags,
        num_sge, rsvd0, rsvd1, remote_addr, rkey, rsvd2, compare_add_mask, swap_mask,
        compare_add, swap });
    layout_of!(HcaRecvWqe => "hca_recv_wqe" { wr_id, num_sge, rsvd });
    layout_of!(HcaCqe => "hca_cqe" { wr_id, byte_len, imm, qpn, src_qp, slid, opcode,
        status, flags, owner, pkey_index });
    layout_of!(HcaEqe => "hca_eqe" { event_type, owner, rsvd0, param, data, rsvd1 });
    {
        use crate::uapi::*;
        consts!(
            UVERBS_ABI_VERSION,
            UAR_QP_OFFSET,
            UAR_QP_SLOTS,
            UAR_CQ_OFFSET,
            UAR_CQ_SLOTS,
            UAR_SRQ_OFFSET,
            UAR_SRQ_SLOTS,
            UAR_SQ_RING_OFFSET,
            UCREATE_QP_SQ_RING,
        );
        layout_of!(HcaUallocUcontextResp => "hca_ualloc_ucontext_resp" { uar_mmap_offset,
            db_mmap_offset, db_reg_offset, doorbell_peer, caps, max_inline });
        layout_of!(HcaUcreateQp => "hca_ucreate_qp" { flags, rsvd });
        layout_of!(HcaUcreateCqResp => "hca_ucreate_cq_resp" { ring_mmap_offset, cqn,
            log_entries, db_slot, rsvd });
        layout_of!(HcaUcreateQpResp => "hca_ucreate_qp_resp" { sq_mmap_offset,
            rq_mmap_offset, qpn, db_slot, sq_log_entries, sq_wqe_shift, rq_log_entries,
            rq_wqe_shift, max_inline });
        layout_of!(HcaUcreateSrqResp => "hca_ucreate_srq_resp" { ring_mmap_offset, srqn,
            db_slot, log_entries, wqe_shift, rsvd0, rsvd1 });
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_owner_bit_flips_every_lap() {
        assert_eq!(owner_bit(0, 2), 1);
        assert_eq!(owner_bit(3, 2), 1);
        assert_eq!(owner_bit(4, 2), 0);
        assert_eq!(owner_bit(8, 2), 1);
        assert_eq!(owner_bit(u32::MAX, 2), 0);
    }

    #[test]
    fn test_layout_names_are_unique() {
        let t = layout();
        let mut names: Vec<_> = t.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), t.len());
    }
}
