//! The MAD wire format every agent here speaks (IBA 13.4; the kernel's `ib_mad.h`,
//! `ib_smi.h`, `ib_sa.h` and `ib_pma.h`): the size, the common header's offsets, the
//! management classes and their versions, the methods, the attribute IDs of each class and
//! the status codes. The SA ([`super`]), the SM ([`super::sm`]) and the switch's PMA
//! ([`super::pma`]) read and write MADs by these, as do the tests and fuzz targets that
//! build them ([`to_sa`]).
//!
//! Every field is big-endian; offsets are bytes from the MAD's start.

use super::SM_LID;
use crate::abi::{Lid, GSI_QKEY, GSI_QPN};
use crate::packet::{Packet, Payload, UD_SEND_ONLY};

/// A MAD is 256 bytes on a GSI QP.
pub const MAD_SIZE: usize = 256;

/// BaseVersion, the first byte of every MAD.
pub const BASE_VERSION: u8 = 1;

/// Offsets in the common MAD header (IBA 13.4.3), and in the headers of the classes that
/// add to it.
pub mod at {
    /// BaseVersion.
    pub const BASE_VERSION: usize = 0;
    /// MgmtClass.
    pub const MGMT_CLASS: usize = 1;
    /// ClassVersion.
    pub const CLASS_VERSION: usize = 2;
    /// Method, with [`super::method::RESP`] set in a response.
    pub const METHOD: usize = 3;
    /// Status (2 bytes; a directed-route SMP keeps its D bit here).
    pub const STATUS: usize = 4;
    /// TransactionID (8 bytes).
    pub const TID: usize = 8;
    /// AttributeID (2 bytes).
    pub const ATTR_ID: usize = 16;
    /// AttributeModifier (4 bytes).
    pub const ATTR_MOD: usize = 20;
    /// An SMP's M_Key (8 bytes).
    pub const SMP_MKEY: usize = 24;
    /// Where an SMP's and a PMA MAD's attribute data starts.
    pub const DATA: usize = 64;
    /// The SA header's AttributeOffset (2 bytes): a record's size in 8-byte words.
    pub const SA_ATTR_OFFSET: usize = 44;
    /// The SA header's ComponentMask (8 bytes): which fields of the record a query sets.
    pub const SA_COMP_MASK: usize = 48;
    /// Where an SA MAD's record starts.
    pub const SA_DATA: usize = 56;
}

/// Management classes (MgmtClass).
pub mod class {
    /// Subnet management, LID-routed SMPs.
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    /// Subnet management, directed-route SMPs.
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    /// Subnet administration.
    pub const SUBN_ADM: u8 = 0x03;
    /// Performance management.
    pub const PERF_MGMT: u8 = 0x04;
}

/// The class version of subnet administration.
pub const SA_CLASS_VERSION: u8 = 2;
/// The class version of performance management.
pub const PERF_CLASS_VERSION: u8 = 1;

/// Methods; a response has [`method::RESP`] set on its request's method.
pub mod method {
    /// Get an attribute.
    pub const GET: u8 = 0x01;
    /// Set an attribute.
    pub const SET: u8 = 0x02;
    /// A trap, from the port that noticed something to the SM (subnet management).
    pub const TRAP: u8 = 0x05;
    /// A Report of a trap to a subscriber.
    pub const REPORT: u8 = 0x06;
    /// Get every record that matches (SA).
    pub const GET_TABLE: u8 = 0x12;
    /// Get the records a request of several parts matches (SA: MultiPathRecord), sent
    /// and answered as RMPP transfers.
    pub const GET_MULTI: u8 = 0x14;
    /// Delete a record (SA).
    pub const DELETE: u8 = 0x15;
    /// The response bit.
    pub const RESP: u8 = 0x80;
    /// The response to a Get or Set, in every management class.
    pub const GET_RESP: u8 = GET | RESP;
}

/// Attribute IDs. One number names different attributes in different classes, so each
/// class has its own list; ClassPortInfo, Notice and InformInfo are the same in all.
pub mod attr {
    /// ClassPortInfo: what the class's agent supports.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Notice: a trap, as a Report carries it.
    pub const NOTICE: u16 = 0x0002;
    /// InformInfo: a subscription to traps.
    pub const INFORM_INFO: u16 = 0x0003;

    /// Subnet management's attributes (IBA 14.2.5).
    pub mod smp {
        /// NodeDescription.
        pub const NODE_DESC: u16 = 0x0010;
        /// NodeInfo.
        pub const NODE_INFO: u16 = 0x0011;
        /// SwitchInfo.
        pub const SWITCH_INFO: u16 = 0x0012;
        /// PortInfo.
        pub const PORT_INFO: u16 = 0x0015;
        /// P_KeyTable.
        pub const PKEY_TABLE: u16 = 0x0016;
        /// LinearForwardingTable.
        pub const LINEAR_FORWARDING_TABLE: u16 = 0x0019;
        /// MulticastForwardingTable.
        pub const MULTICAST_FORWARDING_TABLE: u16 = 0x001b;
        /// SMInfo.
        pub const SM_INFO: u16 = 0x0020;
    }

    /// Subnet administration's records (IBA 15.2.5).
    pub mod sa {
        /// NodeRecord.
        pub const NODE_RECORD: u16 = 0x0011;
        /// PortInfoRecord.
        pub const PORT_INFO_RECORD: u16 = 0x0012;
        /// SL2VLTableRecord.
        pub const SL2VL_TABLE_RECORD: u16 = 0x0013;
        /// SwitchInfoRecord.
        pub const SWITCH_INFO_RECORD: u16 = 0x0014;
        /// LinearForwardingTableRecord.
        pub const LFT_RECORD: u16 = 0x0015;
        /// MulticastForwardingTableRecord.
        pub const MFT_RECORD: u16 = 0x0017;
        /// SMInfoRecord.
        pub const SM_INFO_RECORD: u16 = 0x0018;
        /// LinkRecord.
        pub const LINK_RECORD: u16 = 0x0020;
        /// GUIDInfoRecord.
        pub const GUID_INFO_RECORD: u16 = 0x0030;
        /// ServiceRecord.
        pub const SERVICE_RECORD: u16 = 0x0031;
        /// P_KeyTableRecord.
        pub const PKEY_TABLE_RECORD: u16 = 0x0033;
        /// VLArbitrationTableRecord.
        pub const VLARB_TABLE_RECORD: u16 = 0x0036;
        /// InformInfoRecord.
        pub const INFORM_INFO_RECORD: u16 = 0x00f3;
        /// PathRecord.
        pub const PATH_RECORD: u16 = 0x0035;
        /// MultiPathRecord (GetMulti).
        pub const MULTIPATH_RECORD: u16 = 0x003a;
        /// MCMemberRecord.
        pub const MCMEMBER_RECORD: u16 = 0x0038;
    }

    /// Performance management's attributes (IBA 16.1.3).
    pub mod pma {
        /// PortCounters.
        pub const PORT_COUNTERS: u16 = 0x0012;
        /// PortCountersExtended.
        pub const PORT_COUNTERS_EXT: u16 = 0x001d;
    }
}

/// Status codes (the MAD header's Status, IBA 13.4.7 and 15.2.1.1).
pub mod status {
    /// The class version is not supported.
    pub const BAD_VERSION: u16 = 1 << 2;
    /// The method is not supported.
    pub const METHOD_UNSUPPORTED: u16 = 2 << 2;
    /// The method and attribute combination is not supported.
    pub const METHOD_ATTR_UNSUPPORTED: u16 = 3 << 2;
    /// A field of the attribute is invalid.
    pub const INVALID_FIELD: u16 = 7 << 2;
    /// SA: out of resources.
    pub const NO_RESOURCES: u16 = 1 << 8;
    /// SA: the request is invalid.
    pub const REQ_INVALID: u16 = 2 << 8;
    /// SA: no record matches.
    pub const NO_RECORDS: u16 = 3 << 8;
    /// SA: more than one record matches a Get.
    pub const TOO_MANY_RECORDS: u16 = 4 << 8;
    /// SA: the GID is not valid.
    pub const INVALID_GID: u16 = 5 << 8;
    /// SA: the component mask lacks a field the query needs.
    pub const INSUFFICIENT_COMPONENTS: u16 = 6 << 8;
}

/// A MAD with its common header set (BaseVersion, class, class version, method,
/// transaction ID, attribute ID) and the rest zero.
pub fn header(class: u8, class_version: u8, method: u8, tid: u64, attr_id: u16) -> [u8; MAD_SIZE] {
    let mut m = [0u8; MAD_SIZE];
    m[at::BASE_VERSION] = BASE_VERSION;
    m[at::MGMT_CLASS] = class;
    m[at::CLASS_VERSION] = class_version;
    m[at::METHOD] = method;
    m[at::TID..at::TID + 8].copy_from_slice(&tid.to_be_bytes());
    m[at::ATTR_ID..at::ATTR_ID + 2].copy_from_slice(&attr_id.to_be_bytes());
    m
}

/// The packet that carries `mad` between two GSI QPs (QP1): a UD SEND from QP `src_qpn` at
/// `slid` to QP `dest_qpn` at `dlid`, with the GSI's well-known Q_Key.
pub fn on_gsi(slid: Lid, src_qpn: u32, dlid: Lid, dest_qpn: u32, mad: Vec<u8>) -> Packet {
    Packet {
        slid,
        dlid,
        opcode: UD_SEND_ONLY,
        dest_qpn,
        src_qpn,
        qkey: GSI_QKEY,
        payload: Payload::Bytes(mad),
        ..Default::default()
    }
}

/// A MAD from QP `src_qpn` at `slid` to the SA's (and the switch PMA's) QP1 at [`SM_LID`].
pub fn to_sa(slid: Lid, src_qpn: u32, mad: Vec<u8>) -> Packet {
    on_gsi(slid, src_qpn, SM_LID, GSI_QPN, mad)
}
