//! The fabric's own node, as subnet management sees it: one switch that links every port
//! (its port n to the port at LID n), with the subnet manager behind its management port 0
//! at [`SM_LID`], as a managed switch runs an SM. It answers SMPs as that switch's Subnet
//! Management Agent and SM would, so that infiniband-diags finds the subnet:
//! - LID-routed to [`SM_LID`] (`smpquery nodeinfo 49151`, `sminfo`);
//! - directed-route from a port (`smpquery -D`, `ibnetdiscover`): a route that ends at the
//!   switch is answered here; one that goes on leaves by the switch port its path names, to
//!   that port's QP0 (whose guest's SMA answers), and the answer comes back the same way.
//!   Hop pointers and return paths follow IBA 14.2.2 (C14-9, C14-13), as a switch's do.
//!
//! Gets of NodeInfo, NodeDescription, SwitchInfo, PortInfo, LinearForwardingTable and
//! SMInfo are answered; a Set
//! or any other attribute gets "method/attribute not supported": the fabric configures the
//! ports itself, and no SMP changes anything. Only pure directed routes (both DR LIDs
//! permissive) are forwarded; a port above 254 is not on the switch.

use super::mad::method::{GET, GET_RESP, SET};
use super::mad::{at, attr, class};
use super::{be16, records, status, topology, Ports, MAD_SIZE, SM_LID};
use crate::abi::Lid;
use crate::abi::SMI_QPN;
use crate::packet::{Packet, Payload, UD_SEND_ONLY};

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

type Mad = [u8; MAD_SIZE];

/// The answer to `pkt`, an SMP to the SM's LID or to the permissive LID from a port's
/// QP0: the packet that goes on (an answer, or a directed-route SMP on its way), or None
/// for what is not the switch's (a response or trap LID-routed to it, a broken route).
/// `activity` is SMInfo's ActCount: what the SM has done so far.
pub fn answer(pkt: &Packet, activity: u32, ports: &dyn Ports) -> Option<Packet> {
    let Payload::Bytes(b) = &pkt.payload else {
        return None;
    };
    if pkt.src_qpn != SMI_QPN {
        return None;
    }
    let mut mad: Mad = b.get(..MAD_SIZE)?.try_into().ok()?;
    let switch = Switch {
        ports,
        num_ports: num_ports(ports),
        ingress: pkt.slid,
        activity,
    };
    // On a directed route's hops both LIDs are permissive (so the next port answers
    // the way the SMP came, whatever its LRH said).
    let (from, to) = match mad[1] {
        class::SUBN_LID_ROUTED if pkt.dlid == SM_LID => {
            switch.agent(&mut mad)?;
            (SM_LID, pkt.slid)
        }
        class::SUBN_DIRECTED_ROUTE if pkt.dlid == PERMISSIVE_LID => {
            (PERMISSIVE_LID, switch.directed(&mut mad)?)
        }
        _ => return None,
    };
    Some(Packet {
        slid: from,
        dlid: to,
        opcode: UD_SEND_ONLY,
        dest_qpn: SMI_QPN,
        src_qpn: SMI_QPN,
        pkey: pkt.pkey,
        payload: Payload::Bytes(mad.to_vec()),
        ..Default::default()
    })
}

/// The switch's ports are 1..=n: up to the highest LID on the fabric (254 at most, as a
/// switch has).
pub(super) fn num_ports(ports: &dyn Ports) -> u8 {
    ports.lids().last().copied().unwrap_or(1).clamp(1, 254) as u8
}

struct Switch<'a> {
    ports: &'a dyn Ports,
    num_ports: u8,
    /// The switch port the SMP came in on: the sender's LID.
    ingress: Lid,
    activity: u32,
}

impl Switch<'_> {
    /// The switch port `self.ingress` arrives on, if it is one.
    fn ingress_port(&self) -> Option<u8> {
        u8::try_from(self.ingress)
            .ok()
            .filter(|&p| p >= 1 && p <= self.num_ports)
    }

    /// A directed-route SMP arriving at the switch: moves its hop pointer and return path
    /// as IBA's C14-9 and C14-13 say, answers it if its route ends here, and returns the
    /// LID of the port it leaves for (its next hop, or back towards its sender).
    fn directed(&self, mad: &mut Mad) -> Option<Lid> {
        let p = self.ingress_port()?;
        let pure = be16(mad, DR_SLID) == PERMISSIVE_LID && be16(mad, DR_DLID) == PERMISSIVE_LID;
        let (hop_ptr, hop_cnt) = (usize::from(mad[HOP_PTR]), usize::from(mad[HOP_CNT]));
        if !pure || hop_cnt >= MAX_HOPS {
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
        port_linked(self.ports, out).then_some(Lid::from(out))
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
        let data = mad.get_mut(at::DATA..INITIAL_PATH)?;
        data.fill(0);
        let mut st = if !versions_ok {
            status::BAD_VERSION
        } else if set {
            status::METHOD_ATTR_UNSUPPORTED
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

    /// Fills `data` with attribute `attr`; the MAD status.
    fn get(&self, attr: u16, attr_mod: u32, data: &mut [u8]) -> u16 {
        let mut w = Writer(data);
        let local_port = self.ingress_port().unwrap_or(0);
        match attr {
            attr::smp::NODE_INFO => w.put(
                0,
                &records::node_info(
                    records::NODE_SWITCH,
                    self.num_ports,
                    SM_GUID,
                    16,
                    local_port,
                ),
            ),
            attr::smp::NODE_DESC => w.put(0, NODE_DESC.as_bytes()),
            attr::smp::SWITCH_INFO => w.put(0, &topology::switch_info()),
            attr::smp::LINEAR_FORWARDING_TABLE => {
                let Some(block) = topology::lft_block(self.ports, attr_mod) else {
                    return status::INVALID_FIELD;
                };
                w.put(0, &block);
            }
            attr::smp::PORT_INFO => {
                let Some(port) = u8::try_from(attr_mod).ok().filter(|&p| p <= self.num_ports)
                else {
                    return status::INVALID_FIELD;
                };
                w.put(0, &switch_port_info(self.ports, port, local_port));
            }
            attr::smp::SM_INFO => w.put(0, &topology::sm_info(self.activity)),
            _ => return status::METHOD_ATTR_UNSUPPORTED,
        }
        0
    }
}

/// Whether switch port `p` links a port whose link is up.
fn port_linked(ports: &dyn Ports, p: u8) -> bool {
    let lid = Lid::from(p);
    p >= 1 && p <= num_ports(ports) && ports.guid_of(lid).is_some() && ports.link_up(lid)
}

/// PortInfo of switch port `port`, asked from port `local_port` (0: the management port,
/// which has the switch's LID and the SM).
pub(super) fn switch_port_info(ports: &dyn Ports, port: u8, local_port: u8) -> [u8; 64] {
    if port == 0 {
        return records::port_info(SM_LID, SM_LID, CAP_IS_SM, local_port, records::LINK_UP);
    }
    let link = if port_linked(ports, port) {
        records::LINK_UP
    } else {
        (records::PORT_DOWN, records::PHYS_POLLING)
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
