//! Partitions on the data path: a QP sends in the partition of its P_Key index, every
//! packet carries that P_Key, and a receiving QP takes only packets of its own partition
//! (two limited members never talk). A guest names only an index into the table the
//! fabric gave its port.

use std::time::Duration;

use hca_model::abi::*;
use hca_model::partition::{Partition, DEFAULT_PKEY};
use hca_model::Fabric;
use hca_test_driver::*;

/// A guest with a CQ, a PD and a DMA MR.
struct Node {
    d: Driver,
    pd: u32,
    cq: CqH,
    key: u32,
}

fn node(fabric: &Fabric) -> Node {
    let mut d = Driver::new(Some(fabric), 4);
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let key = d.reg_dma_mr(pd, ALL_ACCESS);
    Node { d, pd, cq, key }
}

/// An RC QP brought to RTS towards `(dlid, dqpn)` in the partition at `pkey_index`.
fn rc_qp(n: &mut Node) -> QpH {
    n.d.create_qp(QPT_RC, n.pd, n.cq.cqn, n.cq.cqn)
}

fn connect(n: &mut Node, qp: &QpH, pkey_index: u16, dlid: u16, dqpn: u32) {
    // Two tries (67 ms apart) for a packet no QP takes.
    let rts = (14, 2, 7);
    (n.d).bring_up_rc_in(
        qp.qpn,
        pkey_index,
        dlid,
        dqpn,
        ALL_ACCESS,
        MTU_4096 as u8,
        rts,
    );
}

/// A SEND of 64 bytes from `a`'s QP to `b`'s (a receive posted there); the sender's
/// completion status once the fabric's clock has run past every retry.
fn send(fabric: &Fabric, a: &mut Node, qa: &mut QpH, b: &mut Node, qb: &mut QpH) -> u32 {
    let (src, dst) = (a.d.alloc(64, 64), b.d.alloc(64, 64));
    a.d.write(src, &pattern(64, 3));
    b.d.post_recv(qb, 9, &[sge(dst, 64, b.key)]);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    wr.num_sge = 1;
    a.d.post_send(qa, wr, &[sge(src, 64, a.key)]);
    for _ in 0..10 {
        fabric.advance(Duration::from_millis(100));
    }
    let done = a.d.drain_statuses(&mut a.cq);
    assert_eq!(done.len(), 1, "{done:?}");
    let status = done[0].1;
    let got = b.d.drain_statuses(&mut b.cq);
    if status == WC_SUCCESS {
        assert_eq!(got, [(9, WC_SUCCESS)]);
        assert_eq!(b.d.read(dst, 64), pattern(64, 3));
    } else {
        assert!(got.is_empty(), "{got:?}");
    }
    status
}

fn table(n: &mut Node) -> [u16; PKEY_TABLE_LEN] {
    decode::<HcaPKeyTable>(&n.d.cmd_raw(CMD_QUERY_PKEYS, &[], 0).1).pkeys
}

/// Sets the fabric's partitions to one: `pkey` with its full and limited members' LIDs.
fn one_partition(fabric: &Fabric, pkey: u16, members: &[u16], limited: &[u16]) {
    fabric
        .set_partitions(&[Partition {
            pkey,
            members: members.to_vec(),
            limited: limited.to_vec(),
        }])
        .unwrap();
}

#[test]
fn test_qps_talk_within_their_partition_and_not_across() {
    let fabric = Fabric::with_manual_clock();
    let (mut a, mut b) = (node(&fabric), node(&fabric));
    one_partition(&fabric, 0x8001, &[a.d.lid(), b.d.lid()], &[]);
    assert_eq!(&table(&mut a)[..3], &[DEFAULT_PKEY, 0x8001, 0]);
    let (mut qa, mut qb) = (rc_qp(&mut a), rc_qp(&mut b));
    connect(&mut a, &qa, 1, b.d.lid(), qb.qpn);
    connect(&mut b, &qb, 1, a.d.lid(), qa.qpn);
    assert_eq!(send(&fabric, &mut a, &mut qa, &mut b, &mut qb), WC_SUCCESS);
    assert_eq!(b.d.hca.stats().pkey_violations, 0);

    // The same peers, B's QP in the default partition: A's packets never reach it, and
    // A's WR runs out of retries as over a lost link.
    let (mut qa, mut qb) = (rc_qp(&mut a), rc_qp(&mut b));
    connect(&mut a, &qa, 1, b.d.lid(), qb.qpn);
    connect(&mut b, &qb, 0, a.d.lid(), qa.qpn);
    assert_eq!(
        send(&fabric, &mut a, &mut qa, &mut b, &mut qb),
        WC_RETRY_EXC_ERR
    );
    assert!(b.d.hca.stats().pkey_violations >= 3, "every try dropped");
}

#[test]
fn test_limited_members_talk_only_to_full_ones() {
    let fabric = Fabric::with_manual_clock();
    let (mut a, mut b, mut c) = (node(&fabric), node(&fabric), node(&fabric));
    let (la, lb, lc) = (a.d.lid(), b.d.lid(), c.d.lid());
    // Partition 2: C a full member, A and B limited ones.
    one_partition(&fabric, 0x0002, &[lc], &[la, lb]);
    assert_eq!(table(&mut a)[1], 0x0002);
    assert_eq!(table(&mut c)[1], 0x8002);
    let (mut qa, mut qb) = (rc_qp(&mut a), rc_qp(&mut b));
    connect(&mut a, &qa, 1, lb, qb.qpn);
    connect(&mut b, &qb, 1, la, qa.qpn);
    assert_eq!(
        send(&fabric, &mut a, &mut qa, &mut b, &mut qb),
        WC_RETRY_EXC_ERR,
        "two limited members"
    );
    let (mut qa, mut qc) = (rc_qp(&mut a), rc_qp(&mut c));
    connect(&mut a, &qa, 1, lc, qc.qpn);
    connect(&mut c, &qc, 1, la, qa.qpn);
    assert_eq!(
        send(&fabric, &mut a, &mut qa, &mut c, &mut qc),
        WC_SUCCESS,
        "a limited member and a full one"
    );
    assert_eq!(
        fabric.partitions(),
        [Partition {
            pkey: 0x8002,
            members: vec![lc],
            limited: vec![la, lb],
        }]
    );
}

#[test]
fn test_a_pkey_index_must_name_an_entry_and_a_new_table_is_announced() {
    let fabric = Fabric::with_manual_clock();
    let mut a = node(&fabric);
    let qa = rc_qp(&mut a);
    let attr = |pkey_index| HcaQpAttr {
        state: QPS_INIT as u8,
        port_num: 1,
        pkey_index,
        ..Default::default()
    };
    let m = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS;
    for idx in [1, 15, 16, 0xffff] {
        assert_eq!(a.d.modify_qp(qa.qpn, m, attr(idx)), CMD_BAD_PARAM, "{idx}");
    }
    a.d.drain_eq(VEC_ASYNC);
    let lid = a.d.lid();
    one_partition(&fabric, 0x8005, &[lid], &[]);
    let events = a.d.drain_eq(VEC_ASYNC);
    assert!(
        events
            .iter()
            .any(|e| u32::from(e.event_type) == EV_PKEY_CHANGE),
        "{events:?}"
    );
    assert_eq!(&table(&mut a)[..2], &[DEFAULT_PKEY, 0x8005]);
    assert_eq!(a.d.modify_qp(qa.qpn, m, attr(1)), CMD_OK);
}

#[test]
fn test_a_mad_travels_in_the_partition_its_wr_names() {
    let fabric = Fabric::with_manual_clock();
    let (mut a, mut b, mut c) = (node(&fabric), node(&fabric), node(&fabric));
    let (la, lb, lc) = (a.d.lid(), b.d.lid(), c.d.lid());
    one_partition(&fabric, 0x8001, &[la, lb], &[]);
    let gsi = |n: &mut Node| {
        let qp = n.d.create_qp(QPT_GSI, n.pd, n.cq.cqn, n.cq.cqn);
        n.d.bring_up_ud(qp.qpn, GSI_QKEY, true);
        let buf = n.d.alloc(40 + 256, 64);
        (qp, buf)
    };
    let (mut qa, sa) = gsi(&mut a);
    let (mut qb, rb) = gsi(&mut b);
    let (mut qc, rc) = gsi(&mut c);
    b.d.post_recv(&mut qb, 1, &[sge(rb, 40 + 256, LOCAL_DMA_LKEY)]);
    c.d.post_recv(&mut qc, 1, &[sge(rc, 40 + 256, LOCAL_DMA_LKEY)]);
    let mut mad = |to: u16, pkey_index: u16, wr_id: u64| {
        let mut wr = send_wr(wr_id, WR_SEND, WQE_SIGNALED);
        wr.ud_dlid = to;
        wr.ud_remote_qpn = GSI_QPN;
        wr.ud_qkey = GSI_QKEY;
        wr.ud_pkey_index = pkey_index;
        a.d.post_send(&mut qa, wr, &[sge(sa, 256, LOCAL_DMA_LKEY)]);
        fabric.advance(Duration::from_millis(1));
        a.d.drain_statuses(&mut a.cq)
    };
    // In partition 1 to a member: it arrives, and says which of B's entries it came in.
    assert_eq!(mad(lb, 1, 1), [(1, WC_SUCCESS)]);
    let got = b.d.drain_cq(&mut b.cq);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].status, got[0].pkey_index), (WC_SUCCESS as u8, 1));
    // To a port outside it: dropped there (a datagram's sender hears nothing).
    let before = c.d.hca.stats().pkey_violations;
    assert_eq!(mad(lc, 1, 2), [(2, WC_SUCCESS)]);
    assert!(c.d.drain_cq(&mut c.cq).is_empty());
    assert_eq!(c.d.hca.stats().pkey_violations, before + 1);
    // In the default partition it reaches C; an empty entry is refused.
    assert_eq!(mad(lc, 0, 3), [(3, WC_SUCCESS)]);
    assert_eq!(c.d.drain_cq(&mut c.cq).len(), 1);
    let refused = mad(lb, 7, 4);
    assert_eq!(refused.len(), 1);
    assert_ne!(refused[0].1, WC_SUCCESS);
}
