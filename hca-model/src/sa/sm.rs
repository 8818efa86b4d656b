//! The subnet manager's own agent on QP0 at [`SM_LID`]: it answers SMInfo Gets (IBA
//! 14.2.5.13), so that infiniband-diags' `sminfo` finds the master SM that every port's
//! PortInfo names. The fabric configures ports itself and sends no SMPs of its own; any
//! other SMP to the SM gets "method/attribute not supported", and no SMP changes anything.

use super::{be16, status, MAD_SIZE, SM_LID};
use crate::abi::SMI_QPN;
use crate::packet::{Packet, Payload, UD_SEND_ONLY};

/// The SM's port GUID: as the nodes' (`abi::node_guid`), for the SM's LID.
pub const SM_GUID: u64 = crate::abi::node_guid(SM_LID);

/// LID-routed subnet management, the class an SMP to a LID carries.
const CLASS_SUBN_LID_ROUTED: u8 = 0x01;
const ATTR_SM_INFO: u16 = 0x0020;
/// Where an SMP's attribute data starts (after its M_Key, DR LIDs and reserved bytes).
const SMP_DATA_OFFSET: usize = 64;
/// SMInfo's SMState for the master SM, in the low four bits beside its priority (0).
const SM_STATE_MASTER: u8 = 3;

/// The answer to `pkt`, an SMP sent to the SM's QP0; None for what is not a Get or Set
/// (responses, traps). `activity` is SMInfo's ActCount: what the SM has done so far.
pub fn answer(pkt: &Packet, activity: u32) -> Option<Packet> {
    let Payload::Bytes(mad) = &pkt.payload else {
        return None;
    };
    let Some(Ok(mad)) = mad.get(..MAD_SIZE).map(<&[u8; MAD_SIZE]>::try_from) else {
        return None;
    };
    let (get, set) = (mad[3] == 0x01, mad[3] == 0x02);
    if pkt.src_qpn != SMI_QPN || mad[1] != CLASS_SUBN_LID_ROUTED || !(get || set) {
        return None;
    }
    let mut resp = *mad;
    resp[3] = 0x81; // GetResp
    let (head, data) = resp.split_at_mut(SMP_DATA_OFFSET);
    data.fill(0); // the data, and the DR paths after it (unused: LID-routed)
    let st = if mad[0] != 1 || mad[2] != 1 {
        status::BAD_VERSION
    } else if get && be16(mad, 16) == ATTR_SM_INFO {
        // GUID, SM_Key (0: no key protects the SM here), ActCount, priority 0 and state.
        let info = SM_GUID.to_be_bytes().into_iter().chain([0; 8]);
        let info = info.chain(activity.to_be_bytes()).chain([SM_STATE_MASTER]);
        for (d, v) in data.iter_mut().zip(info) {
            *d = v;
        }
        0
    } else {
        status::METHOD_ATTR_UNSUPPORTED
    };
    if let Some(s) = head.get_mut(4..6) {
        s.copy_from_slice(&st.to_be_bytes());
    }
    Some(Packet {
        slid: SM_LID,
        dlid: pkt.slid,
        opcode: UD_SEND_ONLY,
        dest_qpn: SMI_QPN,
        src_qpn: SMI_QPN,
        pkey: pkt.pkey,
        payload: Payload::Bytes(resp.to_vec()),
        ..Default::default()
    })
}
