//! RDMA READs longer than what a responder's turn makes of their response (see
//! `hca-model/src/answers.rs`): the response is made a piece at a time, each piece's pages
//! resolved and its key checked as it is made, and what the responder answers after a READ
//! waits for the READ's response. These check that a long READ keeps IBA's semantics that
//! way: every byte arrives in place, later answers never overtake it, a lost piece is
//! made again, and an MR that goes while the response is made stops it.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::{Packet, RC_READ_RESP_FIRST, RC_READ_RESP_ONLY};
use hca_model::sync::Unpoisoned;
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

/// Longer than one turn of the responder makes (16 pieces of 1 MiB), and not a multiple
/// of any MTU.
const LONG: usize = (40 << 20) - 100;

/// The path MTU code for 1024 bytes.
const MTU_1024: u32 = 3;

fn read_wr(wr_id: u64, remote_addr: u64, rkey: u32) -> HcaSendWqe {
    HcaSendWqe {
        remote_addr,
        rkey,
        num_sge: 1,
        ..send_wr(wr_id, WR_RDMA_READ, WQE_SIGNALED)
    }
}

/// A pair with room for long messages.
fn pair(mtu: u32) -> Pair {
    let fabric = Fabric::with_manual_clock();
    Pair::build_with_memory(fabric, 96, mtu as u8, ALL_ACCESS, DEFAULT_RTS)
}

/// Runs the fabric's clock until `d` has `n` completions on `cq` (timeouts included).
fn completions(fabric: &Fabric, d: &mut Driver, cq: &mut CqH, n: usize) -> Vec<HcaCqe> {
    let mut got = d.drain_cq(cq);
    for _ in 0..50 {
        if got.len() >= n {
            return got;
        }
        fabric.advance(Duration::from_millis(20));
        got.extend(d.drain_cq(cq));
    }
    panic!("{} of {n} completions", got.len());
}

#[test]
fn test_a_long_read_over_scattered_pages_arrives_whole_and_in_place() {
    let mut p = pair(MTU_1024);
    // B's MR: every other page of a region, last first, each page its own pattern.
    let npages = LONG.div_ceil(4096) as u64;
    let region = p.b.alloc(2 * npages * 4096, 4096);
    let pages: Vec<u64> = (0..npages)
        .map(|i| region + 2 * 4096 * (npages - 1 - i))
        .collect();
    let mut want = Vec::with_capacity(LONG);
    for (i, &page) in pages.iter().enumerate() {
        let bytes = pattern(4096, i as u8);
        p.b.write(page, &bytes);
        want.extend_from_slice(&bytes);
    }
    want.truncate(LONG);
    let list = p.b.alloc(npages * 8, 8);
    let bytes: Vec<u8> = pages.iter().flat_map(|a| a.to_le_bytes()).collect();
    p.b.write(list, &bytes);
    let iova = 0x7000_0000;
    let rkey =
        p.b.try_reg_mr(&HcaCmdRegMr {
            iova,
            length: LONG as u64,
            page_list: list,
            pdn: p.pd_b,
            access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ,
            npages: npages as u32,
            page_shift: 12,
            ..Default::default()
        })
        .expect("MR");
    let dst = p.a.alloc(LONG as u64, 4096);
    p.a.post_send(
        &mut p.qa,
        read_wr(1, iova, rkey),
        &[sge(dst, LONG as u32, p.key_a)],
    );
    let c = completions(&p.fabric, &mut p.a, &mut p.cq_a, 1);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (1, WC_SUCCESS));
    assert_eq!(c[0].byte_len, LONG as u32);
    assert!(p.a.read(dst, LONG) == want, "every byte from its page");
    let (a, b) = (p.a.hca.stats(), p.b.hca.stats());
    assert_eq!((a.read_gaps, a.retransmits, b.duplicates), (0, 0, 0));
    assert_eq!(
        b.packets_out,
        LONG.div_ceil(1024) as u64,
        "one response each"
    );
}

#[test]
fn test_answers_behind_a_long_read_go_after_its_response() {
    let mut p = pair(MTU_4096);
    let src = p.b.alloc(LONG as u64, 4096);
    p.b.write(src, &pattern(LONG, 3));
    let dst = p.a.alloc(LONG as u64, 4096);
    let (word, old) = (p.b.alloc(8, 8), p.a.alloc(8, 8));
    p.b.write(word, &40u64.to_le_bytes());
    let (small, landed) = (p.a.alloc(64, 8), p.b.alloc(64, 8));
    p.a.write(small, &pattern(64, 5));
    let got = p.b.alloc(64, 8);
    p.b.post_recv(&mut p.qb, 7, &[sge(got, 64, p.key_b)]);
    // One doorbell: the READ, then a SEND, a FETCH_ADD and a WRITE, whose answers
    // (ACKs, the atomic's value) the responder owes behind the READ's response.
    let wrs = [
        (read_wr(1, src, p.key_b), sge(dst, LONG as u32, p.key_a)),
        (
            HcaSendWqe {
                num_sge: 1,
                ..send_wr(2, WR_SEND, WQE_SIGNALED)
            },
            sge(small, 64, p.key_a),
        ),
        (
            HcaSendWqe {
                remote_addr: word,
                rkey: p.key_b,
                compare_add: 2,
                num_sge: 1,
                ..send_wr(3, WR_ATOMIC_FETCH_ADD, WQE_SIGNALED)
            },
            sge(old, 8, p.key_a),
        ),
        (
            HcaSendWqe {
                remote_addr: landed,
                rkey: p.key_b,
                num_sge: 1,
                ..send_wr(4, WR_RDMA_WRITE, WQE_SIGNALED)
            },
            sge(small, 64, p.key_a),
        ),
    ];
    for (w, s) in &wrs {
        p.a.write_send(&mut p.qa, w, &[*s], &[]);
    }
    p.a.ring_sq(&p.qa);
    let c = completions(&p.fabric, &mut p.a, &mut p.cq_a, 4);
    let done: Vec<(u64, u32)> = c.iter().map(|c| (c.wr_id, c.status.into())).collect();
    assert_eq!(
        done,
        [1, 2, 3, 4].map(|i| (i, WC_SUCCESS)),
        "in order, all good"
    );
    assert!(p.a.read(dst, LONG) == pattern(LONG, 3));
    assert_eq!(p.a.read(old, 8), 40u64.to_le_bytes());
    assert_eq!(p.b.read(word, 8), 42u64.to_le_bytes());
    assert_eq!(p.b.read(got, 64), pattern(64, 5));
    assert_eq!(p.b.read(landed, 64), pattern(64, 5));
    // No ACK came before the READ's last response (the requester would have taken it
    // for a lost response, and asked again).
    let a = p.a.hca.stats();
    assert_eq!((a.read_gaps, a.retransmits), (0, 0));
}

#[test]
fn test_a_long_reads_response_goes_out_before_the_nak_that_ends_its_qp() {
    let mut p = pair(MTU_4096);
    let src = p.b.alloc(LONG as u64, 4096);
    p.b.write(src, &pattern(LONG, 4));
    let dst = p.a.alloc(LONG as u64, 4096);
    let small = p.a.alloc(64, 8);
    p.a.write_send(
        &mut p.qa,
        &read_wr(1, src, p.key_b),
        &[sge(dst, LONG as u32, p.key_a)],
        &[],
    );
    // A WRITE with a key B never gave: B NAKs it and its QP goes to ERR, but only after
    // the READ's response, which it owed first.
    let bad = HcaSendWqe {
        remote_addr: src,
        rkey: 0xdead_0000,
        num_sge: 1,
        ..send_wr(2, WR_RDMA_WRITE, WQE_SIGNALED)
    };
    p.a.write_send(&mut p.qa, &bad, &[sge(small, 64, p.key_a)], &[]);
    p.a.ring_sq(&p.qa);
    let c = completions(&p.fabric, &mut p.a, &mut p.cq_a, 2);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (1, WC_SUCCESS));
    assert_eq!((c[1].wr_id, u32::from(c[1].status)), (2, WC_REM_ACCESS_ERR));
    assert!(p.a.read(dst, LONG) == pattern(LONG, 4));
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR);
}

/// Drops the `nth` READ response packet on `lid`'s uplink (once).
struct DropOne {
    lid: u16,
    nth: Mutex<u32>,
}

impl LinkHook for DropOne {
    fn on_packet(&self, link: LinkId, _now: u64, pkt: &mut Packet) -> Verdict {
        let resp = (RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY).contains(&pkt.opcode);
        if link.dir != LinkDir::Up || link.lid != self.lid || !resp {
            return Verdict::Pass;
        }
        let mut n = self.nth.lock_unpoisoned();
        *n = n.wrapping_sub(1);
        if *n == 0 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

#[test]
fn test_a_response_lost_while_the_rest_is_owed_is_made_again() {
    let mut p = pair(MTU_4096);
    let src = p.b.alloc(LONG as u64, 4096);
    p.b.write(src, &pattern(LONG, 6));
    let dst = p.a.alloc(LONG as u64, 4096);
    // A packet of the first piece is lost: the requester asks again from it while the
    // responder still owes the rest, which it rewinds.
    p.fabric.set_hook(Some(Arc::new(DropOne {
        lid: p.b.lid(),
        nth: Mutex::new(100),
    })));
    p.a.post_send(
        &mut p.qa,
        read_wr(1, src, p.key_b),
        &[sge(dst, LONG as u32, p.key_a)],
    );
    let c = completions(&p.fabric, &mut p.a, &mut p.cq_a, 1);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (1, WC_SUCCESS));
    assert!(p.a.read(dst, LONG) == pattern(LONG, 6));
    assert_eq!(p.a.hca.stats().read_gaps, 1, "asked again once");
    assert_eq!(p.b.hca.stats().duplicates, 1);
}

/// Holds the first READ response packet on `lid`'s uplink until the test says go.
struct Gate {
    lid: u16,
    shut: AtomicBool,
    reached: Mutex<Sender<()>>,
    go: Mutex<Receiver<()>>,
}

impl LinkHook for Gate {
    fn on_packet(&self, link: LinkId, _now: u64, pkt: &mut Packet) -> Verdict {
        let resp = (RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY).contains(&pkt.opcode);
        if link.dir == LinkDir::Up && link.lid == self.lid && resp && !self.shut.swap(true, Relaxed)
        {
            let _ = self.reached.lock_unpoisoned().send(());
            let _ = self.go.lock_unpoisoned().recv();
        }
        Verdict::Pass
    }
}

#[test]
fn test_a_read_whose_mr_goes_while_its_response_is_made_ends_in_a_remote_access_error() {
    let mut p = pair(MTU_4096);
    let src = p.b.alloc(LONG as u64, 4096);
    p.b.write(src, &pattern(LONG, 8));
    let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ;
    let mr = p.b.reg_mr(p.pd_b, src, LONG as u64, access);
    let dst = p.a.alloc(LONG as u64, 4096);
    let (reached, at_gate) = channel();
    let (go, wait) = channel();
    p.fabric.set_hook(Some(Arc::new(Gate {
        lid: p.b.lid(),
        shut: false.into(),
        reached: Mutex::new(reached),
        go: Mutex::new(wait),
    })));
    p.a.write_send(
        &mut p.qa,
        &read_wr(1, src, mr),
        &[sge(dst, LONG as u32, p.key_a)],
        &[],
    );
    // A's doorbell on a thread of its own: it stops at the gate once B has made the
    // response's first pieces (one turn's), and owes the rest.
    let (hca, qa) = (p.a.hca.clone(), p.qa.qpn);
    let (db, pi, ring) = (p.qa.db, p.qa.sq_pi, p.qa.ring);
    let bell = std::thread::spawn(move || {
        hca.bar2().store_u32(db, pi);
        if let Some(ring) = ring {
            name_in_ring(hca.bar2(), ring, qa);
        }
        hca.doorbell(DB_SQ);
    });
    at_gate.recv().expect("a response on the wire");
    let h = HcaCmdHandle {
        handle: mr,
        rsvd: 0,
    };
    assert_eq!(p.b.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
    go.send(()).expect("gate open");
    bell.join().expect("A's doorbell");
    let c = completions(&p.fabric, &mut p.a, &mut p.cq_a, 1);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (1, WC_REM_ACCESS_ERR));
    assert!(
        p.a.read(dst, LONG).iter().all(|&b| b == 0),
        "no byte of the MR arrived once it was gone"
    );
    assert!(
        p.b.hca.stats().revoked >= 1,
        "the next piece found the key gone"
    );
    assert_eq!(
        p.b.qp_state(p.qb.qpn),
        QPS_RTS,
        "B's QP is not the READ's to fail"
    );
}
