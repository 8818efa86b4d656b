//! Trap subscriptions (InformInfo Set, IBA 13.4.8.3 and 15.2.5.12) and the Reports the SA
//! sends to subscribers: trap 64 when a port's GID comes into service (its link came up, or
//! its node joined the fabric) and trap 65 when it goes out of service (its link went down,
//! or its node left), as srp_daemon and other fabric watchers subscribe to them.
//!
//! A Report is sent once (the SA does not resend it for want of a ReportResp).
//! Bounded: [`MAX_SUBSCRIPTIONS`] in all, [`MAX_SUBSCRIPTIONS_PER_PORT`] per subscribing port.

use super::mad::{self, at, attr, class, method, status, SA_CLASS_VERSION};
use super::{be16, be32, gid_at, gid_guid, Found, Peer, Ports, Request, SM_LID};
use crate::abi::Lid;

pub const MAX_SUBSCRIPTIONS: usize = 256;
pub const MAX_SUBSCRIPTIONS_PER_PORT: usize = 16;
pub const TRAP_GID_IN_SERVICE: u16 = 64;
pub const TRAP_GID_OUT_OF_SERVICE: u16 = 65;
/// A subscription to every generic trap, or for every LID.
const ALL: u16 = 0xffff;
const RECORD_SIZE: usize = 36;
/// An InformInfoRecord: SubscriberGID, SubscriberEnum, 6 reserved bytes, the InformInfo,
/// padding.
const INFORM_RECORD_SIZE: usize = 64;

/// InformInfoRecord component mask bits (IBA 15.2.5.12).
pub(super) mod iir {
    pub const SUBSCRIBER_GID: u64 = 1 << 0;
    pub const ENUM: u64 = 1 << 1;
}
/// Notice type "subnet management", from a class manager (the SM).
const NOTICE_TYPE_SUBN_MGMT: u8 = 3;
const PRODUCER_CLASS_MANAGER: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Subscription {
    to: Peer,
    trap: u16,
    /// The LIDs whose traps are wanted (inclusive); None: every LID.
    lids: Option<(Lid, Lid)>,
}

#[derive(Debug, Default)]
pub(super) struct Subscriptions {
    live: Vec<Subscription>,
}

impl Subscriptions {
    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    /// InformInfo Set: subscribes (Subscribe = 1) or unsubscribes (0) the asker.
    pub(super) fn set(&mut self, req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
        let d = req.data();
        if d[22] != 1 {
            // Vendor-specific traps: the fabric produces none.
            return Err(status::REQ_INVALID);
        }
        let gid = gid_at(d, 0);
        let (begin, end) = (be16(d, 16), be16(d, 18));
        let lids = if gid != [0; 16] {
            // A GID names one port.
            let lid = gid_guid(&gid)
                .and_then(|g| ports.lid_of(g))
                .ok_or(status::INVALID_GID)?;
            Some((lid, lid))
        } else if begin == ALL {
            None
        } else {
            Some((begin, end.max(begin)))
        };
        let qpn = be32(d, 28) >> 8;
        let sub = Subscription {
            to: Peer {
                lid: req.from.lid,
                qpn: if qpn == 0 { req.from.qpn } else { qpn },
            },
            trap: be16(d, 26),
            lids,
        };
        if d[23] == 0 {
            self.live.retain(|s| s != &sub);
        } else if !self.live.contains(&sub) {
            let mine = self.live.iter().filter(|s| s.to.lid == sub.to.lid).count();
            if self.live.len() >= MAX_SUBSCRIPTIONS || mine >= MAX_SUBSCRIPTIONS_PER_PORT {
                return Err(status::NO_RESOURCES);
            }
            self.live.push(sub);
        }
        Ok(Found::One(d[..RECORD_SIZE].to_vec()))
    }

    /// InformInfoRecord Get/GetTable: each subscription, by its subscriber's GID and its
    /// number among that subscriber's (SubscriberEnum), with the LID range it gave (or
    /// every LID) and the QP its Reports go to.
    pub(super) fn records(&self, req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
        let d = req.data();
        let mut rows = Vec::new();
        let mut counts: Vec<(Lid, u16)> = Vec::new();
        for s in &self.live {
            let n = match counts.iter_mut().find(|(l, _)| *l == s.to.lid) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    counts.push((s.to.lid, 0));
                    0
                }
            };
            let Some(guid) = ports.guid_of(s.to.lid) else {
                continue;
            };
            let gid = super::port_gid(guid);
            if req.has(iir::SUBSCRIBER_GID) && gid_at(d, 0) != gid
                || req.has(iir::ENUM) && be16(d, 16) != n
            {
                continue;
            }
            // The InformInfo as it was set: generic, for every trap type and producer.
            let mut i = [0u8; RECORD_SIZE];
            let (begin, end) = s.lids.unwrap_or((ALL, 0));
            i[16..18].copy_from_slice(&begin.to_be_bytes());
            i[18..20].copy_from_slice(&end.to_be_bytes());
            (i[22], i[23]) = (1, 1); // IsGeneric, Subscribe
            i[24..26].copy_from_slice(&ALL.to_be_bytes());
            i[26..28].copy_from_slice(&s.trap.to_be_bytes());
            i[28..32].copy_from_slice(&(s.to.qpn << 8).to_be_bytes());
            i[33..36].copy_from_slice(&[0xff; 3]);
            let mut r = [0u8; INFORM_RECORD_SIZE];
            r[0..16].copy_from_slice(&gid);
            r[16..18].copy_from_slice(&n.to_be_bytes());
            r[24..24 + RECORD_SIZE].copy_from_slice(&i);
            rows.push(r.to_vec());
        }
        Ok(Found::Records {
            size: INFORM_RECORD_SIZE,
            rows,
        })
    }

    /// Who subscribed to `trap` from the port at `lid`.
    pub(super) fn subscribers(&self, trap: u16, lid: Lid) -> Vec<Peer> {
        let mut to: Vec<Peer> = self
            .live
            .iter()
            .filter(|s| s.trap == trap || s.trap == ALL)
            .filter(|s| s.lids.is_none_or(|(b, e)| (b..=e).contains(&lid)))
            .map(|s| s.to)
            .collect();
        to.sort();
        to.dedup();
        to
    }
}

/// A Report of generic trap `trap` about the port whose GID is `gid` (traps 64 and 65
/// carry the GID in their data details).
pub(super) fn report(tid: u64, trap: u16, gid: &[u8; 16]) -> Vec<u8> {
    let mut m = mad::header(
        class::SUBN_ADM,
        SA_CLASS_VERSION,
        method::REPORT,
        tid,
        attr::NOTICE,
    );
    // The Notice (80 bytes of data): IsGeneric | Type, then the 24-bit ProducerType.
    const N: usize = at::SA_DATA;
    m[N..N + 4].copy_from_slice(
        &(0x8000_0000 | u32::from(NOTICE_TYPE_SUBN_MGMT) << 24 | PRODUCER_CLASS_MANAGER)
            .to_be_bytes(),
    );
    m[N + 4..N + 6].copy_from_slice(&trap.to_be_bytes());
    m[N + 6..N + 8].copy_from_slice(&SM_LID.to_be_bytes()); // IssuerLID
    m[N + 16..N + 32].copy_from_slice(gid); // DataDetails: 6 reserved bytes, then the GID
    m.to_vec()
}
