//! A hostile guest (A) drives its HCA with any sequence of WQEs, raw ring bytes, producer
//! indices, doorbells, BAR2 writes and commands, while the fabric's clock moves and a link
//! hook drops, duplicates and delays packets. The device never panics, and the victim (B)
//! sees no byte change outside the window it opened to A and its own CQ rings.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

use crate::common;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Pick {
    Real,
    RealPlus(u16),
    Any(u64),
}

fn resolve(p: Pick, real: u64) -> u64 {
    match p {
        Pick::Real => real,
        Pick::RealPlus(d) => real.wrapping_add(u64::from(d)),
        Pick::Any(v) => v,
    }
}

#[derive(Arbitrary, Debug)]
pub enum Action {
    Wqe {
        opcode: u8,
        flags: u8,
        remote: Pick,
        rkey: Pick,
        imm: Pick,
        inline_len: u16,
        sges: Vec<(Pick, u16, Pick)>,
        raw_num_sge: Option<u8>,
    },
    RawWqe(Vec<u8>),
    ProducerIndex {
        recv: bool,
        value: u32,
    },
    Doorbell(u32),
    Bar2Write {
        offset: u16,
        value: u32,
    },
    Command {
        opcode: u8,
        input: Vec<u8>,
    },
    Advance {
        ms: u8,
    },
    /// The hook's next verdicts (two bits each: pass, drop, duplicate, delay).
    Verdicts(u64),
}

/// Drops, duplicates and delays by the bits it was given last.
struct Chaos(AtomicU64);

impl LinkHook for Chaos {
    fn on_packet(&self, _: LinkId, _: u64, _: &mut Packet) -> Verdict {
        let v = self.0.load(Relaxed);
        self.0.store(v.rotate_right(2), Relaxed);
        match v & 3 {
            0 => Verdict::Pass,
            1 => Verdict::Drop,
            2 => Verdict::Duplicate,
            _ => Verdict::Delay(200_000),
        }
    }
}

/// What the fuzzer decodes its bytes into.
pub type Input = Vec<Action>;

/// One run of the target on a decoded input.
pub fn run(actions: Input) {
    let fabric = Fabric::with_manual_clock();
    let chaos = Arc::new(Chaos(AtomicU64::new(0)));
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, DEFAULT_RTS);
    let win = common::Window::open(&mut p, |_, _| {});
    let (window, window_key) = (win.addr, win.key);
    fabric.set_hook(Some(chaos.clone()));
    for a in actions.iter().take(64) {
        match a {
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
                    opcode: *opcode % 12,
                    flags: *flags,
                    num_sge: raw_num_sge.unwrap_or(sges.len() as u8),
                    imm: resolve(*imm, u64::from(window_key)) as u32,
                    remote_addr: resolve(*remote, window),
                    rkey: resolve(*rkey, u64::from(window_key)) as u32,
                    inline_len: u32::from(*inline_len),
                    ud_dlid: p.b.lid(),
                    ..Default::default()
                };
                let list: Vec<HcaSge> = sges
                    .iter()
                    .take(20)
                    .map(|(addr, len, key)| {
                        sge(
                            resolve(*addr, 0x10_0000),
                            u32::from(*len),
                            resolve(*key, u64::from(p.key_a)) as u32,
                        )
                    })
                    .collect();
                p.a.write_send(&mut p.qa, &wr, &list, &[]);
                p.a.ring_sq(&p.qa);
            }
            Action::RawWqe(bytes) => {
                let slot = p.a.write_send(&mut p.qa, &HcaSendWqe::default(), &[], &[]);
                let n = bytes.len().min(1024);
                p.a.write(slot, &bytes[..n]);
                p.a.ring_sq(&p.qa);
            }
            Action::ProducerIndex { recv, value } => {
                let off = BAR2_QP_DB_OFFSET + p.qa.qpn * 8 + if *recv { 4 } else { 0 };
                p.a.hca.bar2().store_u32(off, *value);
                p.a.hca.doorbell(if *recv { DB_RQ } else { DB_SQ });
            }
            Action::Doorbell(v) => p.a.hca.doorbell(*v),
            Action::Bar2Write { offset, value } => {
                let off = u32::from(*offset) * 4 % BAR2_SIZE;
                p.a.hca.bar2().store_u32(off, *value);
                p.a.hca.doorbell(*value & 3);
            }
            Action::Command { opcode, input } => {
                p.a.cmd_raw(u32::from(*opcode), &input[..input.len().min(64)], 0);
            }
            Action::Advance { ms } => fabric.advance(Duration::from_millis(u64::from(*ms))),
            Action::Verdicts(v) => chaos.0.store(*v, Relaxed),
        }
    }
    fabric.set_hook(None);
    fabric.advance(Duration::from_secs(1));
    win.check(&p);
}
