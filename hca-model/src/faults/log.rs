//! The JSON-lines log of decisions.

/// One decision in the JSON-lines log: the time, where (a node, an HCA or a link), what,
/// and the packet or event it hit. Absent fields are left out.
#[derive(Default, serde::Serialize)]
pub(super) struct LogLine {
    pub(super) t_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) hca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) link: Option<String>,
    /// Which draw of its stream (packet, doorbell, interrupt, WQE, CQE) this was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) n: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) slid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) dlid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) opcode: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) qpn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) psn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) class: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) vector: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cqn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) live: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fault: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) delay_ns: Option<u64>,
}
