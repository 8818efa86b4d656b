//! The responder fed raw packets, as a hostile peer (or a spoofing node) could put them on
//! the wire: any opcode (RC's, UC's, UD's), PSN, QPN, RETH, AtomicETH, AETH, ImmDt, IETH and payload, one
//! packet at a time (trains are the model's own, never a peer's); packets with no time
//! between them reach the device as one burst. The device never panics,
//! and the victim's memory changes only inside the window it opened and its own CQ rings.

use std::time::Duration;

use arbitrary::Arbitrary;
use hca_model::abi::*;
use hca_model::packet::{Packet, Payload, RareHeaders, Reth, SmallBytes};
use hca_model::Fabric;
use hca_test_driver::*;

use crate::common;

#[derive(Arbitrary, Debug)]
pub struct Raw {
    from_peer: bool,
    slid: u16,
    opcode: u8,
    psn_delta: i8,
    any_psn: Option<u32>,
    qp: u8,
    src_qpn: Option<u32>,
    reth: Option<(u16, bool, u32)>,
    atomic: Option<(u64, u64)>,
    aeth: Option<(u8, u32)>,
    imm: Option<u32>,
    ieth: Option<bool>,
    qkey: u32,
    payload: Vec<u8>,
    mtu: u8,
    corrupt: bool,
    /// UC's transport bits (a peer may set them on any opcode).
    uc: bool,
    advance_ms: u8,
}

const OPCODES: [u8; 27] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x1d, 0x64, 0x65, 0xff,
];

/// What the fuzzer decodes its bytes into.
pub type Input = Vec<Raw>;

/// One run of the target on a decoded input.
pub fn run(packets: Input) {
    drive(packets);
}

/// Like [`run`]; the fingerprint of the state the run ends in (see [`common::fingerprint`]).
pub fn run_fingerprint(packets: Input) -> u64 {
    common::fingerprint(&drive(packets))
}

fn drive(packets: Input) -> Pair {
    let mut p = common::pair(Fabric::with_manual_clock(), 3);
    let (mut udqpn, mut srq_udqpn, mut ucqpn) = (0, 0, 0);
    let win = common::Window::open(&mut p, |p, bufs| {
        let mut ud = p.b.create_qp(QPT_UD, p.pd_b, p.cq_b.cqn, p.cq_b.cqn);
        p.b.bring_up_ud(ud.qpn, 0x1234, false);
        for i in 0..4 {
            p.b.post_recv(
                &mut ud,
                100 + i,
                &[sge(bufs + 512 * i, 512, LOCAL_DMA_LKEY)],
            );
        }
        udqpn = ud.qpn;
        // A UD QP taking its receives from an SRQ (its limit armed), into the window too.
        let mut srq = p.b.try_create_srq(p.pd_b, 2, 1).expect("create SRQ");
        let ud =
            p.b.try_create_qp_on_srq(QPT_UD, p.pd_b, (p.cq_b.cqn, p.cq_b.cqn), srq.srqn)
                .expect("create QP on SRQ");
        p.b.bring_up_ud(ud.qpn, 0x1234, false);
        for i in 0..4 {
            let buf = sge(bufs + 0x800 + 512 * i, 512, LOCAL_DMA_LKEY);
            p.b.post_srq_recv(&mut srq, 200 + i, &[buf]);
        }
        srq_udqpn = ud.qpn;
        // A UC QP connected to A's RC QP, with receives into the window too.
        let mut uc = p.b.create_qp(QPT_UC, p.pd_b, p.cq_b.cqn, p.cq_b.cqn);
        let (la, qa) = (p.a.lid(), p.qa.qpn);
        p.b.bring_up_uc(uc.qpn, la, qa, ALL_ACCESS, 3);
        for i in 0..4 {
            let buf = sge(bufs + 0x1000 + 256 * i, 256, LOCAL_DMA_LKEY);
            p.b.post_recv(&mut uc, 300 + i, &[buf]);
        }
        ucqpn = uc.qpn;
    });
    let (window, window_key) = (win.addr, win.key);
    let (la, lb) = (p.a.lid(), p.b.lid());
    // The expected PSN as of the last pump, and packets queued since (a burst's PSNs run on
    // from it: asking the device would be a turn that moves them).
    let mut epsn_then = p.b.query_qp(p.qb.qpn).rq_psn;
    let mut queued = 0u32;
    for r in packets.iter().take(64) {
        let dest_qpn = match r.qp % 6 {
            0 => p.qb.qpn,
            1 => udqpn,
            2 => 1,
            3 => srq_udqpn,
            4 => ucqpn,
            _ => u32::from(r.qp),
        };
        let epsn = epsn_then.wrapping_add(queued);
        let psn = r.any_psn.unwrap_or(epsn.wrapping_add(r.psn_delta as u32)) & 0xff_ffff;
        let opcode = OPCODES[usize::from(r.opcode) % OPCODES.len()];
        let mtu = 256u32 << (r.mtu % 5);
        let payload: Vec<u8> = r.payload.iter().copied().take(4 * 4096).collect();
        let pkt = Packet {
            slid: if r.from_peer { la } else { r.slid },
            dlid: lb,
            opcode,
            dest_qpn,
            src_qpn: r.src_qpn.unwrap_or(p.qa.qpn),
            psn,
            reth: r.reth.map(|(off, real_key, len)| Reth {
                va: window.wrapping_add(u64::from(off)),
                rkey: if real_key { window_key } else { len },
                len: len % 0x8000,
            }),
            rare: RareHeaders {
                atomic: r.atomic,
                ..Default::default()
            }
            .boxed(),
            aeth: r.aeth,
            imm: r.imm,
            ieth: r
                .ieth
                .map(|real| if real { window_key } else { 0x1234_5678 }),
            qkey: r.qkey,
            // As a requester sends them: a few bytes inside the packet, more as bytes.
            payload: match SmallBytes::new(&payload) {
                Some(small) => Payload::Small(small),
                None => Payload::Bytes(payload),
            },
            count: 1,
            mtu,
            corrupt: r.corrupt,
            uc: r.uc,
            ..Default::default()
        };
        p.fabric.enqueue(pkt);
        queued += 1;
        // Packets with no time between them move as one burst (one ACK for all of it).
        if r.advance_ms != 0 {
            p.fabric.pump();
            p.fabric
                .advance(Duration::from_millis(u64::from(r.advance_ms)));
            epsn_then = p.b.query_qp(p.qb.qpn).rq_psn;
            queued = 0;
        }
    }
    p.fabric.pump();
    win.check(&p);
    p
}
