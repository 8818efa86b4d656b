//! What a hostile guest does to its own HCA, one step at a time: the actions that the
//! model's property tests (`tests/hostile.rs`, drawn by proptest) and the `device` fuzz
//! target (decoded by `arbitrary`, with the `arbitrary` feature) both use, and how one is
//! carried out. The attacker is A of a [`Pair`]. The numbers it hands the device are often
//! the real ones (the window its peer opened to it, its own key) or near them, so that more
//! of its requests get past the first checks and reach the deeper ones.

use hca_model::abi::*;

use crate::{sge, HcaSge, Pair};

/// A number, picked to be interesting more often than chance would.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Pick {
    /// The real value.
    Real,
    /// Just past it (inside or beyond what it names).
    RealPlus(u32),
    Any(u64),
}

impl Pick {
    pub fn resolve(self, real: u64) -> u64 {
        match self {
            Pick::Real => real,
            Pick::RealPlus(d) => real.wrapping_add(u64::from(d)),
            Pick::Any(v) => v,
        }
    }
}

/// One step of a hostile guest.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Action {
    /// Writes a WQE with these fields (and SGEs: address, length, lkey) at the next SQ slot
    /// and rings; `raw_num_sge` overrides the SGE count the WQE claims.
    Wqe {
        opcode: u8,
        flags: u8,
        remote: Pick,
        rkey: Pick,
        imm: Pick,
        inline_len: u32,
        sges: Vec<(Pick, u32, Pick)>,
        raw_num_sge: Option<u8>,
    },
    /// Writes raw bytes over the next SQ slot and rings.
    RawWqe(Vec<u8>),
    /// Publishes any send or receive producer index and rings for it.
    ProducerIndex { recv: bool, value: u32 },
    /// Rings any doorbell value.
    Doorbell(u32),
    /// Writes any u32 at any word of BAR2 (mailbox, doorbell records, EQ indices, header),
    /// then rings the doorbell class its low bits name.
    Bar2Write { offset: u32, value: u32 },
    /// Runs a command with any opcode and input bytes.
    Command { opcode: u32, input: Vec<u8> },
}

/// What "real" means for the attacker's remote numbers: the window its peer opened to it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub window: u64,
    pub key: u32,
}

/// Where A's "real" local buffers start (inside its guest memory).
const LOCAL_BASE: u64 = 0x10_0000;
/// Most SGEs one WQE is written with (a 1 KiB slot holds fewer; the rest overflow into
/// the next slot, which the device must survive too).
const MAX_SGES: usize = 20;
/// Most raw bytes written over a slot.
const MAX_RAW: usize = 1024;

impl Action {
    /// Carries the action out as A of `p`.
    pub fn apply(&self, p: &mut Pair, t: Target) {
        match self {
            Action::Wqe {
                opcode,
                flags,
                remote,
                rkey,
                imm,
                inline_len,
                sges,
                raw_num_sge,
            } => {
                let wr = HcaSendWqe {
                    wr_id: 0xbad,
                    // Mostly opcodes the device knows, some it does not.
                    opcode: opcode % 16,
                    flags: *flags,
                    num_sge: raw_num_sge.unwrap_or(sges.len().min(MAX_SGES) as u8),
                    imm: imm.resolve(u64::from(t.key)) as u32,
                    remote_addr: remote.resolve(t.window),
                    rkey: rkey.resolve(u64::from(t.key)) as u32,
                    inline_len: *inline_len,
                    ud_dlid: p.b.lid(),
                    ..Default::default()
                };
                let key_a = u64::from(p.key_a);
                let list: Vec<HcaSge> = sges
                    .iter()
                    .take(MAX_SGES)
                    .map(|(addr, len, key)| {
                        sge(addr.resolve(LOCAL_BASE), *len, key.resolve(key_a) as u32)
                    })
                    .collect();
                p.a.write_send(&mut p.qa, &wr, &list, &[]);
                p.a.ring_sq(&p.qa);
            }
            Action::RawWqe(bytes) => {
                let slot = p.a.write_send(&mut p.qa, &HcaSendWqe::default(), &[], &[]);
                p.a.write(slot, bytes.get(..MAX_RAW).unwrap_or(bytes));
                p.a.ring_sq(&p.qa);
            }
            Action::ProducerIndex { recv, value } => {
                let off = BAR2_QP_DB_OFFSET + p.qa.qpn * 8 + if *recv { 4 } else { 0 };
                p.a.hca.bar2().store_u32(off, *value);
                p.a.hca.doorbell(if *recv { DB_RQ } else { DB_SQ });
            }
            Action::Doorbell(v) => p.a.hca.doorbell(*v),
            Action::Bar2Write { offset, value } => {
                p.a.hca.bar2().store_u32((offset % BAR2_SIZE) & !3, *value);
                p.a.hca.doorbell(*value & 3);
            }
            Action::Command { opcode, input } => {
                let room = HcaCmdMailbox::default().input.len();
                p.a.cmd_raw(*opcode, input.get(..room).unwrap_or(input), 0);
            }
        }
    }
}
