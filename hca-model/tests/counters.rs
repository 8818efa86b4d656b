//! The port's counters (QUERY_COUNTERS): what hca_ib shows as hardware counters and through
//! its Performance Management agent (perfquery, ib_core's sysfs `counters/`). Every packet
//! is counted once on each end, with its octets as they cross the wire; drops, resends,
//! discards and link-downs each show where a user debugging a fabric looks for them.

use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::Fabric;
use hca_test_driver::*;
use vm_memory::ByteValued;

const MS: Duration = Duration::from_millis(1);

/// Every counter of a device, read eight at a time as the driver does.
fn counters(d: &mut Driver) -> Vec<u64> {
    let mut all = Vec::new();
    for first in (0..COUNTERS_LEN).step_by(8) {
        let input = HcaCmdCounters { first, rsvd: 0 };
        let (status, out) = d.cmd_raw(CMD_QUERY_COUNTERS, input.as_slice(), 0);
        assert_eq!(status, CMD_OK);
        all.extend(decode::<HcaCounters>(&out).values);
    }
    all.truncate(COUNTERS_LEN as usize);
    all
}

/// `now - before`, counter by counter.
fn delta(before: &[u64], now: &[u64]) -> Vec<u64> {
    now.iter().zip(before).map(|(n, b)| n - b).collect()
}

fn at(c: &[u64], ctr: u32) -> u64 {
    c[ctr as usize]
}

/// An RDMA WRITE of one SGE to `dst` through `rkey`, signaled.
fn write_wr(wr_id: u64, dst: u64, rkey: u32) -> HcaSendWqe {
    let mut wr = send_wr(wr_id, WR_RDMA_WRITE, WQE_SIGNALED);
    wr.remote_addr = dst;
    wr.rkey = rkey;
    wr.num_sge = 1;
    wr
}

/// Posts `wr` on A's QP and checks that it completed (on a Pair's manual clock the
/// completion is there when post_send returns); how A's and B's counters moved since
/// `before`.
fn post_ok(
    p: &mut Pair,
    wr: HcaSendWqe,
    sge: HcaSge,
    before: &(Vec<u64>, Vec<u64>),
) -> (Vec<u64>, Vec<u64>) {
    p.a.post_send(&mut p.qa, wr, &[sge]);
    let c = p.a.poll_cq(&mut p.cq_a).expect("a completion");
    assert_eq!(u32::from(c.status), WC_SUCCESS);
    (
        delta(&before.0, &counters(&mut p.a)),
        delta(&before.1, &counters(&mut p.b)),
    )
}

/// LRH, BTH, ICRC and VCRC: what every packet carries.
const BASE: u64 = 8 + 12 + 4 + 2;

#[test]
fn test_each_packet_counts_once_on_each_end_with_its_wire_octets() {
    let mut p = Pair::new(MTU_4096 as u8);
    let (src, dst) = (p.a.alloc(16 << 10, 4096), p.b.alloc(16 << 10, 4096));
    let start = (counters(&mut p.a), counters(&mut p.b));

    // An 8-byte SEND (SEND Only), and its ACK (AETH).
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    wr.num_sge = 1;
    let from = sge(src, 8, p.key_a);
    let (a, b) = post_ok(&mut p, wr, from, &start);
    assert_eq!(at(&a, CTR_TX_PACKETS), 1, "{a:?}");
    assert_eq!(at(&a, CTR_TX_OCTETS), BASE + 8);
    assert_eq!(at(&b, CTR_RX_PACKETS), 1, "{b:?}");
    assert_eq!(at(&b, CTR_RX_OCTETS), BASE + 8);
    assert_eq!(at(&b, CTR_TX_PACKETS), 1, "the ACK");
    assert_eq!(at(&b, CTR_TX_OCTETS), BASE + 4);
    assert_eq!(at(&a, CTR_RX_OCTETS), BASE + 4);

    // A 10,000-byte RDMA WRITE at MTU 4096: three packets, the RETH on the first.
    let before = (counters(&mut p.a), counters(&mut p.b));
    let wr = write_wr(2, dst, p.key_b);
    let from = sge(src, 10_000, p.key_a);
    let (a, b) = post_ok(&mut p, wr, from, &before);
    assert_eq!(at(&a, CTR_TX_PACKETS), 3, "{a:?}");
    assert_eq!(at(&a, CTR_TX_OCTETS), 3 * BASE + 16 + 10_000);
    assert_eq!(at(&b, CTR_RX_OCTETS), 3 * BASE + 16 + 10_000);

    // Nothing lost: what one end sent, the other received, in packets and in octets.
    let (a, b) = (
        delta(&start.0, &counters(&mut p.a)),
        delta(&start.1, &counters(&mut p.b)),
    );
    for (tx, rx) in [
        (CTR_TX_PACKETS, CTR_RX_PACKETS),
        (CTR_TX_OCTETS, CTR_RX_OCTETS),
    ] {
        assert_eq!(at(&a, tx), at(&b, rx), "a -> b: {a:?} {b:?}");
        assert_eq!(at(&b, tx), at(&a, rx), "b -> a: {a:?} {b:?}");
    }
    for ctr in [
        CTR_RETRANSMITS,
        CTR_TX_DISCARDS,
        CTR_ICRC_ERRORS,
        CTR_DUPLICATES,
    ] {
        assert_eq!(at(&a, ctr) + at(&b, ctr), 0, "counter {ctr}: {a:?} {b:?}");
    }
}

#[test]
fn test_drops_show_as_resends_and_as_packets_sent_but_not_received() {
    let mut p = Pair::new(MTU_4096 as u8);
    let (src, dst) = (p.a.alloc(64 << 10, 4096), p.b.alloc(64 << 10, 4096));
    let (a0, b0) = (counters(&mut p.a), counters(&mut p.b));
    let plan = FaultPlan::parse("seed = 5\n[[link]]\ndrop = 0.2\n").unwrap();
    let hook = Arc::new(FaultHook::new(plan, None));
    hook.set_origin(p.fabric.now_ns());
    p.fabric.set_hook(Some(hook.clone()));
    for i in 0..20 {
        let wr = write_wr(i, dst, p.key_b);
        p.a.post_send(&mut p.qa, wr, &[sge(src, 16 << 10, p.key_a)]);
        let mut done = p.a.drain_cq(&mut p.cq_a);
        while done.is_empty() {
            p.fabric.advance(10 * MS);
            done = p.a.drain_cq(&mut p.cq_a);
        }
        assert_eq!(u32::from(done[0].status), WC_SUCCESS);
    }
    p.fabric.set_hook(None);
    let dropped = hook.counts().dropped;
    assert!(dropped > 0, "the plan dropped nothing");
    let (a, b) = (
        delta(&a0, &counters(&mut p.a)),
        delta(&b0, &counters(&mut p.b)),
    );
    let sent = at(&a, CTR_TX_PACKETS) + at(&b, CTR_TX_PACKETS);
    let got = at(&a, CTR_RX_PACKETS) + at(&b, CTR_RX_PACKETS);
    assert_eq!(
        sent - got,
        dropped,
        "sent {sent}, received {got}: {a:?} {b:?}"
    );
    assert!(at(&a, CTR_RETRANSMITS) > 0, "{a:?}");
}

#[test]
fn test_a_packet_to_no_port_is_a_discard_and_a_link_down_is_counted() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let mut b = Driver::new(Some(&fabric), 4);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(4);
    let mut ud = a.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    a.bring_up_ud(ud.qpn, 7, false);
    let buf = a.alloc(64, 8);
    let before = counters(&mut a);
    a.post_send(
        &mut ud,
        ud_send_wr(40, 2, 7),
        &[sge(buf, 64, LOCAL_DMA_LKEY)],
    );
    a.drain_cq(&mut cq);
    let c = delta(&before, &counters(&mut a));
    assert_eq!(at(&c, CTR_TX_DISCARDS), 1, "no port at LID 40: {c:?}");

    let plan = FaultPlan::parse("[[link]]\nlid = 2\ndown = [[10.0, 20.0]]\n").unwrap();
    let hook = Arc::new(FaultHook::new(plan, None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook));
    let before = counters(&mut b);
    for _ in 0..30 {
        fabric.advance(MS);
    }
    let c = delta(&before, &counters(&mut b));
    assert_eq!(at(&c, CTR_LINK_DOWNED), 1, "{c:?}");
}

#[test]
fn test_query_counters_checks_its_index_and_zeroes_past_the_last() {
    let mut d = Driver::new(None, 4);
    let past = HcaCmdCounters {
        first: COUNTERS_LEN,
        rsvd: 0,
    };
    let (status, _) = d.cmd_raw(CMD_QUERY_COUNTERS, past.as_slice(), 0);
    assert_eq!(status, CMD_BAD_PARAM);
    let last = HcaCmdCounters {
        first: COUNTERS_LEN - 1,
        rsvd: 0,
    };
    let (status, out) = d.cmd_raw(CMD_QUERY_COUNTERS, last.as_slice(), 0);
    assert_eq!(status, CMD_OK);
    assert_eq!(decode::<HcaCounters>(&out).values[1..], [0; 7]);
}
