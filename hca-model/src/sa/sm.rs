//! The fabric's switches, as subnet management sees them (`crate::subnet`): by default one
//! switch that links every port (its port n to the port at LID n); on a subnet of several,
//! each with the HCA ports and inter-switch links its topology gives it. The subnet
//! manager sits behind the first switch's management port 0 at [`SM_LID`], as a managed
//! switch runs an SM. Each switch answers SMPs as its Subnet Management Agent would (and
//! the first as the SM too), so that infiniband-diags finds the subnet:
//! - LID-routed to a switch's LID (`smpquery nodeinfo 49151`, `sminfo`, `ibroute`): carried
//!   there and back by the switches' forwarding tables, and answered from the port it came
//!   in by;
//! - directed-route from a port (`smpquery -D`, `ibnetdiscover`): a route that ends at a
//!   switch is answered there; one that goes on leaves by the port its path names, into
//!   the next switch or to an HCA port's QP0 (whose guest's SMA answers), and the answer
//!   comes back the same way. Hop pointers and return paths follow IBA 14.2.2 (C14-9,
//!   C14-13) at every switch, and a port whose link is down ends the route.
//!
//! Gets of NodeInfo, NodeDescription, SwitchInfo, PortInfo, LinearForwardingTable and
//! (the SM's switch) SMInfo are answered. While the fabric is its own SM, a Set or any
//! other attribute gets "method/attribute not supported": the fabric's SM configures the
//! ports itself, and no SMP changes anything. Under a user's SM (`Fabric::set_guest_sm`)
//! the switch runs no SM (no IsSM, no SMInfo) and takes that SM's Sets of SwitchInfo,
//! PortInfo and the forwarding tables (`switch_tables.rs`), and Gets show what it set.
//! Only pure directed routes (both DR LIDs permissive) are forwarded.

use super::mad::method::{GET, GET_RESP, SET};
use super::mad::{at, attr, class};
use super::switch_tables::SwitchTables;
use super::{be16, be64, records, status, topology, Ports, MAD_SIZE, SM_LID};
use crate::abi::Lid;
use crate::abi::SMI_QPN;
use crate::packet::{Packet, Payload, UD_SEND_ONLY};
use crate::subnet::{self, Peer, Subnet};

/// The switch's GUID (node, system and port 0): as the nodes' (`abi::node_guid`), for the
/// SM's LID.
pub const SM_GUID: u64 = crate::abi::node_guid(SM_LID);
/// The LID a directed-route SMP goes to: whatever is at the other end of the link.
pub const PERMISSIVE_LID: Lid = 0xffff;
/// What `smpquery nodedesc` shows for the switch.
pub const NODE_DESC: &str = "hcabench fabric switch (subnet manager)";

/// Directed-route SMP offsets (IBA 14.2.1.2), beside the common header's ([`at`]).
const HOP_PTR: usize = 6;
const HOP_CNT: usize = 7;
const DR_SLID: usize = 32;
const DR_DLID: usize = 34;
const INITIAL_PATH: usize = 128;
const RETURN_PATH: usize = 192;
/// The status bit of a directed-route SMP on its way back.
const DIRECTION: u16 = 0x8000;
/// A directed route's most hops.
const MAX_HOPS: usize = 64;

/// PortInfo:CapabilityMask's IsSM.
const CAP_IS_SM: u32 = 1 << 1;
/// The default partition's P_Key, full member.
const DEFAULT_PKEY: u16 = 0xffff;

type Mad = [u8; MAD_SIZE];

/// Where an SMP goes from the switches.
#[derive(Debug)]
pub enum Out {
    /// Onto the fabric: an answer, or a directed-route SMP on its way to an HCA's QP0.
    To(Packet),
    /// A directed-route SMP (or its answer) leaving this host over inter-host link `link`,
    /// for the switch at its far end to take on.
    Across {
        /// The link's index.
        link: usize,
        /// The SMP as it leaves.
        pkt: Packet,
    },
}

/// Where a directed route leaves this host's switches.
enum Leave {
    Hca(Lid),
    Across(usize),
}

/// The answer to `pkt`, an SMP to a switch's LID or to the permissive LID from a port's
/// QP0: the packet that goes on (an answer, or a directed-route SMP on its way), or None
/// for what is not the switches' (a response or trap LID-routed to one, a broken route).
/// `activity` is SMInfo's ActCount: what the SM has done so far.
pub fn answer(pkt: &Packet, activity: u32, ports: &dyn Ports) -> Option<Out> {
    answer_at(pkt, None, activity, ports)
}

/// The answer to `pkt`, a directed-route SMP that came in over an inter-host link into
/// local switch `at.0` by its port `at.1` (see [`answer`]).
pub fn answer_arrived(
    pkt: &Packet,
    at: (usize, u8),
    activity: u32,
    ports: &dyn Ports,
) -> Option<Out> {
    if pkt.dlid != PERMISSIVE_LID {
        return None;
    }
    answer_at(pkt, Some(at), activity, ports)
}

fn answer_at(
    pkt: &Packet,
    arrived: Option<(usize, u8)>,
    activity: u32,
    ports: &dyn Ports,
) -> Option<Out> {
    let Payload::Bytes(b) = &pkt.payload else {
        return None;
    };
    if pkt.src_qpn != SMI_QPN {
        return None;
    }
    let mut mad: Mad = b.get(..MAD_SIZE)?.try_into().ok()?;
    let subnet = ports.subnet();
    // On a directed route's hops both LIDs are permissive (so the next port answers
    // the way the SMP came, whatever its LRH said).
    let (from, to) = match mad[1] {
        class::SUBN_LID_ROUTED => {
            let sw = subnet.switch_at(pkt.dlid)?;
            // Answered from the port it came in by, back the way the tables send it.
            let ingress = subnet.route(pkt.slid, pkt.dlid)?.last()?.port_in;
            subnet.route(pkt.dlid, pkt.slid)?;
            let at = Switch::new(&subnet, ports, sw, ingress, activity)?;
            at.agent(&mut mad)?;
            (pkt.dlid, pkt.slid)
        }
        class::SUBN_DIRECTED_ROUTE if pkt.dlid == PERMISSIVE_LID => {
            let (sw, ingress) = match arrived {
                Some(at) => at,
                None => subnet.attachment(pkt.slid)?,
            };
            if !subnet.is_local(sw) {
                return None;
            }
            match directed(&subnet, ports, sw, ingress, activity, &mut mad)? {
                Leave::Hca(lid) => (PERMISSIVE_LID, lid),
                Leave::Across(link) => {
                    let pkt = smp(pkt.pkey, PERMISSIVE_LID, PERMISSIVE_LID, mad);
                    return Some(Out::Across { link, pkt });
                }
            }
        }
        _ => return None,
    };
    Some(Out::To(smp(pkt.pkey, from, to, mad)))
}

/// Trap 128 ("link state of at least one port of the switch changed"), LID-routed from the
/// switch at `switch_lid` to the SM at `sm_lid` with the switch's `mkey` (IBA 14.2.5.1:
/// a Notice, generic, urgent, from a switch; its DataDetails the switch's LID). OpenSM
/// answers it with a TrapRepress and sweeps at once.
pub(crate) fn trap_128(switch_lid: Lid, sm_lid: Lid, mkey: u64, tid: u64) -> Packet {
    /// Notice type "urgent", producer "switch".
    const URGENT: u32 = 1;
    const PRODUCER_SWITCH: u32 = 2;
    let mut m = super::mad::header(
        class::SUBN_LID_ROUTED,
        1,
        super::mad::method::TRAP,
        tid,
        attr::NOTICE,
    );
    m[at::SMP_MKEY..at::SMP_MKEY + 8].copy_from_slice(&mkey.to_be_bytes());
    const N: usize = at::DATA;
    m[N..N + 4].copy_from_slice(&(0x8000_0000 | URGENT << 24 | PRODUCER_SWITCH).to_be_bytes());
    m[N + 4..N + 6].copy_from_slice(&128u16.to_be_bytes());
    m[N + 6..N + 8].copy_from_slice(&switch_lid.to_be_bytes()); // IssuerLID
    m[N + 10..N + 12].copy_from_slice(&switch_lid.to_be_bytes()); // DataDetails: LIDADDR
    smp(DEFAULT_PKEY, switch_lid, sm_lid, m)
}

/// An SMP from QP0 to QP0.
fn smp(pkey: u16, slid: Lid, dlid: Lid, mad: Mad) -> Packet {
    Packet {
        slid,
        dlid,
        opcode: UD_SEND_ONLY,
        dest_qpn: SMI_QPN,
        src_qpn: SMI_QPN,
        pkey,
        payload: Payload::Bytes(mad.to_vec()),
        ..Default::default()
    }
}

/// A directed-route SMP arriving at switch `sw` by port `ingress`, taken on from switch
/// to switch (each moving its hop pointer and return path as IBA's C14-9 and C14-13 say,
/// and the one its route ends at answering it) until it leaves for an HCA's port, or
/// over an inter-host link. None where it goes nowhere (a port with no link up, a broken
/// route).
fn directed(
    subnet: &Subnet,
    ports: &dyn Ports,
    mut sw: usize,
    mut ingress: u8,
    activity: u32,
    mad: &mut Mad,
) -> Option<Leave> {
    let pure = be16(mad, DR_SLID) == PERMISSIVE_LID && be16(mad, DR_DLID) == PERMISSIVE_LID;
    if !pure {
        return None;
    }
    // Each switch is one hop: no route crosses more than a route has, out and back.
    for _ in 0..=2 * MAX_HOPS + 1 {
        let here = Switch::new(subnet, ports, sw, ingress, activity)?;
        let out = here.directed(mad)?;
        if !here.port_linked(out) {
            return None;
        }
        match subnet.peer(sw, out) {
            Peer::Hca(lid) => return Some(Leave::Hca(lid)),
            Peer::Switch { link, sw: next, .. } if !subnet.is_local(next) => {
                return Some(Leave::Across(link))
            }
            Peer::Switch { sw: next, port, .. } => (sw, ingress) = (next, port),
            Peer::None => return None,
        }
    }
    None
}

/// One switch's agent, answering an SMP that came in by its port `ingress`.
struct Switch<'a> {
    subnet: &'a Subnet,
    ports: &'a dyn Ports,
    sw: usize,
    node: &'a subnet::Switch,
    ingress: u8,
    activity: u32,
    /// What a user's SM set in the switches, under one (None: the fabric is the SM).
    tables: Option<&'a std::sync::RwLock<Vec<SwitchTables>>>,
}

impl<'a> Switch<'a> {
    fn new(
        subnet: &'a Subnet,
        ports: &'a dyn Ports,
        sw: usize,
        ingress: u8,
        activity: u32,
    ) -> Option<Self> {
        Some(Self {
            subnet,
            ports,
            sw,
            node: subnet.switch(sw)?,
            ingress,
            activity,
            tables: ports.switch_tables(),
        })
    }

    /// Runs `f` on what a user's SM set in this switch, under one.
    fn user_tables<T>(&self, f: impl FnOnce(&SwitchTables) -> T) -> Option<T> {
        let t = self.tables?.read().unwrap_or_else(|e| e.into_inner());
        t.get(self.sw).map(f)
    }

    /// Whether port `p` links a port whose link is up.
    fn port_linked(&self, p: u8) -> bool {
        p >= 1 && p <= self.node.num_ports && port_up(self.subnet, self.ports, self.sw, p)
    }

    /// A directed-route SMP at this switch: moves its hop pointer and return path as
    /// IBA's C14-9 and C14-13 say, answers it if its route ends here, and returns the
    /// port it leaves by (its next hop, or back towards its sender).
    fn directed(&self, mad: &mut Mad) -> Option<u8> {
        let p = Some(self.ingress).filter(|&p| p >= 1)?;
        let (hop_ptr, hop_cnt) = (usize::from(mad[HOP_PTR]), usize::from(mad[HOP_CNT]));
        if hop_cnt >= MAX_HOPS {
            return None;
        }
        let returning = be16(mad, at::STATUS) & DIRECTION != 0;
        let out = if !returning {
            // C14-9:2 and :3: the sender moved the pointer onto this hop.
            if hop_ptr == 0 || hop_ptr > hop_cnt {
                return None;
            }
            *mad.get_mut(RETURN_PATH + hop_ptr)? = p;
            if hop_ptr < hop_cnt {
                // On to the port the path names next.
                mad[HOP_PTR] += 1;
                *mad.get(INITIAL_PATH + hop_ptr + 1)?
            } else {
                // The route ends here: the agent has it past the last hop (C14-9:4), and
                // its answer starts back the way it came (C14-13:1).
                mad[HOP_PTR] = (hop_cnt + 1) as u8;
                self.agent(mad)?;
                mad[HOP_PTR] = hop_cnt as u8;
                *mad.get(RETURN_PATH + hop_cnt)?
            }
        } else {
            // C14-13:2: an answer passing through, back one hop.
            if hop_ptr < 2 || hop_ptr > hop_cnt {
                return None;
            }
            mad[HOP_PTR] -= 1;
            *mad.get(RETURN_PATH + hop_ptr - 1)?
        };
        Some(out)
    }

    /// Answers a Get or Set in place (None for what is neither: responses, traps).
    fn agent(&self, mad: &mut Mad) -> Option<()> {
        let (get, set) = (mad[3] == GET, mad[3] == SET);
        if !(get || set) {
            return None;
        }
        mad[3] = GET_RESP;
        let attr = be16(mad, at::ATTR_ID);
        let attr_mod =
            u32::from_be_bytes(mad.get(at::ATTR_MOD..at::ATTR_MOD + 4)?.try_into().ok()?);
        let versions_ok = mad[0] == 1 && mad[2] == 1;
        let mkey = be64(mad, at::SMP_MKEY);
        // A user's SM's M_Key keeps out every SMP without it (a Get too, when protected):
        // no answer at all (IBA 14.2.4.1).
        if self.user_tables(|t| t.admits(mkey, set)) == Some(false) {
            return None;
        }
        let data = mad.get_mut(at::DATA..INITIAL_PATH)?;
        let sent: [u8; 64] = data.try_into().ok()?;
        data.fill(0);
        let mut st = if !versions_ok {
            status::BAD_VERSION
        } else if set {
            match self.set(attr, attr_mod, &sent) {
                Err(st) => st,
                Ok(()) => self.get(attr, attr_mod, data),
            }
        } else {
            self.get(attr, attr_mod, data)
        };
        if mad[1] == class::SUBN_DIRECTED_ROUTE {
            st |= DIRECTION;
        }
        mad.get_mut(at::STATUS..at::STATUS + 2)?
            .copy_from_slice(&st.to_be_bytes());
        Some(())
    }

    /// Takes a user's SM's Set (see `switch_tables.rs`): Err with the MAD status (or
    /// [`SILENT`]) if the switch cannot.
    fn set(&self, attr: u16, attr_mod: u32, data: &[u8; 64]) -> Result<(), u16> {
        let Some(tables) = self.tables else {
            return Err(status::METHOD_ATTR_UNSUPPORTED);
        };
        let mut all = tables.write().unwrap_or_else(|e| e.into_inner());
        let t = all
            .get_mut(self.sw)
            .ok_or(status::METHOD_ATTR_UNSUPPORTED)?;
        let n = self.node.num_ports;
        match attr {
            attr::smp::SWITCH_INFO => t.set_switch_info(data),
            attr::smp::LINEAR_FORWARDING_TABLE => t.set_lft_block(attr_mod, data, n),
            attr::smp::MULTICAST_FORWARDING_TABLE => t.set_mft_block(attr_mod, data, n),
            attr::smp::PORT_INFO => {
                let p = u8::try_from(attr_mod).map_err(|_| status::INVALID_FIELD)?;
                t.set_port_info(p, data, self.node.lid, n)
            }
            _ => Err(status::METHOD_ATTR_UNSUPPORTED),
        }
    }

    /// Fills `data` with attribute `attr`; the MAD status.
    fn get(&self, attr: u16, attr_mod: u32, data: &mut [u8]) -> u16 {
        let mut w = Writer(data);
        let under_user_sm = self.user_tables(|t| self.get_set(t, attr, attr_mod, &mut w));
        if let Some(Some(st)) = under_user_sm {
            return st;
        }
        self.get_own(attr, attr_mod, &mut w)
    }

    /// What a Get shows of what a user's SM set in the switch, or None for what it shows
    /// as under the fabric's SM.
    fn get_set(&self, t: &SwitchTables, attr: u16, attr_mod: u32, w: &mut Writer) -> Option<u16> {
        let block = |b: Option<[u8; 64]>, w: &mut Writer| match b {
            Some(b) => {
                w.put(0, &b);
                0
            }
            None => status::INVALID_FIELD,
        };
        Some(match attr {
            attr::smp::SWITCH_INFO => {
                w.put(0, &t.switch_info(topology::switch_info()));
                0
            }
            attr::smp::LINEAR_FORWARDING_TABLE => block(t.lft_block(attr_mod), w),
            attr::smp::MULTICAST_FORWARDING_TABLE => block(t.mft_block(attr_mod), w),
            // No SM runs here.
            attr::smp::SM_INFO => status::METHOD_ATTR_UNSUPPORTED,
            // The management port's table, block 0 (PartitionCap 16): the default
            // partition, as OpenSM reads it. External ports enforce no partitions
            // (PartitionEnforcementCap 0).
            attr::smp::PKEY_TABLE if attr_mod == 0 => {
                w.put(0, &DEFAULT_PKEY.to_be_bytes());
                0
            }
            attr::smp::PKEY_TABLE => status::INVALID_FIELD,
            _ => return None,
        })
    }

    /// What a Get shows under the fabric's SM (and under a user's, of what it sets not).
    fn get_own(&self, attr: u16, attr_mod: u32, w: &mut Writer) -> u16 {
        let node = self.node;
        match attr {
            attr::smp::NODE_INFO => w.put(
                0,
                &records::node_info(
                    records::NODE_SWITCH,
                    node.num_ports,
                    node.guid,
                    16,
                    self.ingress,
                ),
            ),
            attr::smp::NODE_DESC => w.put(0, node_desc(node).as_bytes()),
            attr::smp::SWITCH_INFO => w.put(0, &topology::switch_info()),
            attr::smp::LINEAR_FORWARDING_TABLE => {
                let Some(block) = self.subnet.lft_block(self.sw, attr_mod) else {
                    return status::INVALID_FIELD;
                };
                w.put(0, &block);
            }
            attr::smp::PORT_INFO => {
                let Some(port) = u8::try_from(attr_mod).ok().filter(|&p| p <= node.num_ports)
                else {
                    return status::INVALID_FIELD;
                };
                let info = switch_port_info(self.subnet, self.ports, self.sw, port, self.ingress);
                w.put(0, &info);
            }
            // Only the SM's switch runs an SM.
            attr::smp::SM_INFO if self.sw == 0 => w.put(0, &topology::sm_info(self.activity)),
            _ => return status::METHOD_ATTR_UNSUPPORTED,
        }
        0
    }
}

/// What `smpquery nodedesc` shows for a switch.
pub(super) fn node_desc(node: &subnet::Switch) -> String {
    match (node.name.as_str(), node.lid == SM_LID) {
        // The default single switch has no name.
        ("", _) => NODE_DESC.to_string(),
        (name, true) => format!("hcabench switch {name} (subnet manager)"),
        (name, false) => format!("hcabench switch {name}"),
    }
}

/// Whether port `p` of switch `sw` links a port whose link is up.
pub(super) fn port_up(subnet: &Subnet, ports: &dyn Ports, sw: usize, p: u8) -> bool {
    match subnet.peer(sw, p) {
        Peer::Hca(lid) => ports.guid_of(lid).is_some() && ports.link_up(lid),
        Peer::Switch { link, .. } => subnet.link_up(link) == Some(true),
        Peer::None => false,
    }
}

/// PortInfo of port `port` of switch `sw`, asked from its port `local_port` (0: the
/// management port, which has the switch's LID; the SM's switch's has the SM).
pub(super) fn switch_port_info(
    subnet: &Subnet,
    ports: &dyn Ports,
    sw: usize,
    port: u8,
    local_port: u8,
) -> [u8; 64] {
    // (The ports' links first, then what the user's SM set: no lock is held across.)
    let up = port != 0 && port_up(subnet, ports, sw, port);
    let user_sm = (ports.switch_tables()).map(|t| {
        let t = t.read().unwrap_or_else(|e| e.into_inner());
        t.get(sw)
            .map_or((0, 2), |t| (t.sm_lid(), t.port_state(port)))
    });
    if port == 0 {
        let lid = subnet.switch(sw).map_or(SM_LID, |s| s.lid);
        return match user_sm {
            Some((sm_lid, _)) => records::port_info(lid, sm_lid, 0, local_port, records::LINK_UP),
            None => {
                let caps = if sw == 0 { CAP_IS_SM } else { 0 };
                records::port_info(lid, SM_LID, caps, local_port, records::LINK_UP)
            }
        };
    }
    let link = match (up, user_sm) {
        (true, Some((_, state))) => (state, records::LINK_UP.1),
        (true, None) => records::LINK_UP,
        (false, _) => (records::PORT_DOWN, records::PHYS_POLLING),
    };
    records::port_info(0, 0, 0, local_port, link)
}

/// Writes at byte offsets of an attribute's data (what does not fit is left out).
struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        let end = (at + bytes.len()).min(self.0.len());
        if let (Some(dst), Some(src)) =
            (self.0.get_mut(at..end), bytes.get(..end.saturating_sub(at)))
        {
            dst.copy_from_slice(src);
        }
    }
}
