//! Service records (IBA 15.2.5.14): a port registers a service (ServiceID, GID, P_Key,
//! name, key and data) for a lease, and any port finds it with Get/GetTable.
//!
//! A record is replaced by a Set naming the same ServiceID, GID and P_Key; it goes when its
//! lease runs out (leases run on the fabric's clock, checked whenever the store is used) or
//! on Delete by the port that registered it or by a Delete that names its ServiceKey.
//! Bounded: [`MAX_SERVICES`] in all, [`MAX_SERVICES_PER_PORT`] per registering port.

use super::{be32, gid_at, gid_guid, status, Found, Ports, Request, DEFAULT_PKEY};
use crate::abi::Lid;

pub const MAX_SERVICES: usize = 1024;
pub const MAX_SERVICES_PER_PORT: usize = 64;
const RECORD_SIZE: usize = 176;
/// A lease of all ones never runs out.
const LEASE_FOREVER: u32 = 0xffff_ffff;

/// ServiceRecord component mask bits.
pub(super) mod sr {
    pub const ID: u64 = 1 << 0;
    pub const GID: u64 = 1 << 1;
    pub const PKEY: u64 = 1 << 2;
    pub const KEY: u64 = 1 << 5;
    pub const NAME: u64 = 1 << 6;
}

#[derive(Debug)]
struct Service {
    record: Vec<u8>,
    owner: Lid,
    /// When the lease runs out (fabric nanoseconds); None: never.
    expires: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct Services {
    live: Vec<Service>,
}

/// Whether record `rec` matches what `req` names.
fn matches(req: &Request, rec: &[u8]) -> bool {
    let d = req.data();
    let same =
        |bit: u64, at: std::ops::Range<usize>| !req.has(bit) || d.get(at.clone()) == rec.get(at);
    same(sr::ID, 0..8)
        && same(sr::GID, 8..24)
        && same(sr::PKEY, 24..26)
        && same(sr::KEY, 32..48)
        && same(sr::NAME, 48..112)
}

impl Services {
    pub(super) fn len(&self) -> usize {
        self.live.len()
    }

    fn expire(&mut self, now: u64) {
        self.live.retain(|s| s.expires.is_none_or(|t| t > now));
    }

    /// ServiceRecord Set: registers (or renews) a service.
    pub(super) fn set(&mut self, req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
        let now = ports.now_ns();
        self.expire(now);
        if !req.has(sr::ID | sr::GID) {
            return Err(status::INSUFFICIENT_COMPONENTS);
        }
        let d = req.data();
        if gid_guid(&gid_at(d, 8))
            .and_then(|g| ports.lid_of(g))
            .is_none()
        {
            return Err(status::INVALID_GID);
        }
        let mut record: [u8; RECORD_SIZE] = d[..RECORD_SIZE].try_into().unwrap_or([0; RECORD_SIZE]);
        if !req.has(sr::PKEY) {
            record[24..26].copy_from_slice(&DEFAULT_PKEY.to_be_bytes());
        }
        // The same service (ID, GID, P_Key) is renewed in place.
        let same = |s: &Service| s.record.get(0..26) == record.get(0..26);
        let record = record.to_vec();
        self.live.retain(|s| !same(s));
        let owner = req.from.lid;
        if self.live.len() >= MAX_SERVICES
            || self.live.iter().filter(|s| s.owner == owner).count() >= MAX_SERVICES_PER_PORT
        {
            return Err(status::NO_RESOURCES);
        }
        let lease = be32(&record, 28);
        let expires = (lease != LEASE_FOREVER).then(|| now + u64::from(lease) * 1_000_000_000);
        self.live.push(Service {
            record: record.clone(),
            owner,
            expires,
        });
        Ok(Found::One(record))
    }

    /// ServiceRecord Get/GetTable: the live records that match.
    pub(super) fn find(&mut self, req: &Request, now: u64) -> Found {
        self.expire(now);
        let rows = self
            .live
            .iter()
            .filter(|s| matches(req, &s.record))
            .map(|s| s.record.clone())
            .collect();
        Found::Records {
            size: RECORD_SIZE,
            rows,
        }
    }

    /// ServiceRecord Delete: removes the matching records the asker registered, or whose
    /// ServiceKey it names; answers with the first it removed.
    pub(super) fn delete(&mut self, req: &Request, now: u64) -> Result<Found, u16> {
        self.expire(now);
        if req.comp_mask & (sr::ID | sr::GID | sr::NAME) == 0 {
            return Err(status::INSUFFICIENT_COMPONENTS);
        }
        let keyed = req.has(sr::KEY) && req.data()[32..48].iter().any(|&b| b != 0);
        let mut first = None;
        self.live.retain(|s| {
            let gone = matches(req, &s.record) && (s.owner == req.from.lid || keyed);
            if gone && first.is_none() {
                first = Some(s.record.clone());
            }
            !gone
        });
        first.map(Found::One).ok_or(status::NO_RECORDS)
    }
}
