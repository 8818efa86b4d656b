//! Subnet services on the fabric. The subnet administrator, asked the way ib_sa asks: a MAD
//! from a guest's GSI QP to the SM LID its port reports, the answer back on the same QP. And
//! multicast as IPoIB uses it: join through the SA, attach a UD QP, send to the MLID.

use hca_model::abi::*;
use hca_model::partition::Partition;
use hca_model::sa::{port_gid, IPOIB_BROADCAST_MGID, SM_LID};
use hca_model::Fabric;
use hca_test_driver::*;

/// A guest whose QP1 is ready, with a CQ for it.
struct Gsi {
    d: Driver,
    cq: CqH,
    qp: QpH,
    /// The port GUID (the interface ID of its GID).
    guid: u64,
}

fn gsi(fabric: &Fabric) -> Gsi {
    let mut d = Driver::new(Some(fabric), 4);
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let qp = d.create_qp(QPT_GSI, pd, cq.cqn, cq.cqn);
    d.bring_up_ud(qp.qpn, GSI_QKEY, true);
    let port: HcaPortAttr = decode(&d.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    Gsi {
        d,
        cq,
        qp,
        guid: port.port_guid,
    }
}

/// Sends `mad` to the SA and returns its answer (the 256 bytes after the GRH room).
fn ask(g: &mut Gsi, mad: &[u8; 256]) -> Vec<u8> {
    let rbuf = g.d.alloc(40 + 256, 64);
    g.d.post_recv(&mut g.qp, 1, &[sge(rbuf, 40 + 256, LOCAL_DMA_LKEY)]);
    let sbuf = g.d.alloc(256, 64);
    g.d.write(sbuf, mad);
    let mut wr = send_wr(2, WR_SEND, WQE_SIGNALED);
    let port: HcaPortAttr = decode(&g.d.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    wr.ud_dlid = port.sm_lid;
    wr.ud_remote_qpn = GSI_QPN;
    wr.ud_qkey = GSI_QKEY;
    g.d.post_send(&mut g.qp, wr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let done = g.d.drain_cq(&mut g.cq);
    let recv = done
        .iter()
        .find(|c| u32::from(c.opcode) == CQE_OP_RECV)
        .expect("the SA answered");
    assert_eq!(
        (recv.slid, recv.src_qp, recv.byte_len),
        (SM_LID, GSI_QPN, 296)
    );
    g.d.read(rbuf + 40, 256)
}

fn sa_mad(method: u8, attr: u16, comp_mask: u64, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x03, 2, method]);
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m
}

#[test]
fn test_the_port_names_the_sa_and_a_path_record_query_is_answered() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let b = gsi(&fabric);
    let port: HcaPortAttr = decode(&a.d.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    assert_eq!(port.sm_lid, SM_LID);
    let gid_b = port_gid(b.guid);
    // PathRecord Get by DGID (component mask bit 2).
    let mut q = sa_mad(0x01, 0x0035, 1 << 2, 42);
    q[56 + 8..56 + 24].copy_from_slice(&gid_b);
    let r = ask(&mut a, &q);
    assert_eq!(
        (r[3], u16::from_be_bytes([r[4], r[5]])),
        (0x81, 0),
        "GetResp, OK"
    );
    assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), 42);
    assert_eq!(r[56 + 8..56 + 24], gid_b);
    assert_eq!(
        u16::from_be_bytes([r[56 + 40], r[56 + 41]]),
        b.d.lid(),
        "DLID"
    );
    assert_eq!(u16::from_be_bytes([r[56 + 42], r[56 + 43]]), a.d.lid());
}

/// Joins the IPoIB broadcast group through the SA, as IPoIB does; the group's MLID.
fn join_broadcast(g: &mut Gsi, tid: u64) -> u16 {
    let mut q = sa_mad(0x02, 0x0038, 1 | 2 | 1 << 7 | 1 << 16, tid);
    q[56..72].copy_from_slice(&IPOIB_BROADCAST_MGID);
    q[72..88].copy_from_slice(&port_gid(g.guid));
    q[56 + 40..56 + 42].copy_from_slice(&0xffffu16.to_be_bytes());
    q[56 + 48] = 1; // full member
    let r = ask(g, &q);
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0, "joined");
    u16::from_be_bytes([r[56 + 36], r[56 + 37]])
}

#[test]
fn test_members_join_the_broadcast_group_and_the_fabric_shows_them() {
    let fabric = Fabric::with_manual_clock();
    let mut nodes: Vec<Gsi> = (0..3).map(|_| gsi(&fabric)).collect();
    for (i, g) in nodes.iter_mut().enumerate() {
        assert_eq!(join_broadcast(g, i as u64), 0xc000);
    }
    let members = fabric.with_sa(|sa| {
        sa.groups()
            .find(|g| g.mgid == IPOIB_BROADCAST_MGID)
            .map(|g| g.members.len())
    });
    assert_eq!(members, Some(3));
}

/// IPoIB's Q_Key for the default partition's groups.
const IPOIB_QKEY: u32 = 0x0b;

/// A UD QP with its own CQ and `n` receives of `size` bytes (after the GRH room) posted.
struct Ud {
    cq: CqH,
    qp: QpH,
    bufs: Vec<u64>,
}

fn ud(g: &mut Gsi, n: usize, size: u32) -> Ud {
    let pd = g.d.alloc_pd();
    let cq = g.d.create_cq(6);
    let mut qp = g.d.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    g.d.bring_up_ud(qp.qpn, IPOIB_QKEY, false);
    let mut bufs = Vec::new();
    for i in 0..n {
        let b = g.d.alloc(u64::from(40 + size), 64);
        g.d.post_recv(&mut qp, i as u64, &[sge(b, 40 + size, LOCAL_DMA_LKEY)]);
        bufs.push(b);
    }
    Ud { cq, qp, bufs }
}

fn mcast(qpn: u32, mgid: [u8; 16], mlid: u16) -> HcaCmdMcast {
    HcaCmdMcast {
        mgid,
        qpn,
        mlid,
        rsvd: 0,
    }
}

fn send_to(g: &mut Gsi, u: &mut Ud, dlid: u16, data: &[u8]) {
    let buf = g.d.alloc(data.len() as u64, 64);
    g.d.write(buf, data);
    let mut wr = send_wr(9, WR_SEND, 0);
    wr.ud_dlid = dlid;
    wr.ud_remote_qpn = 0xff_ffff; // the multicast QPN
    wr.ud_qkey = IPOIB_QKEY;
    g.d.post_send(
        &mut u.qp,
        wr,
        &[sge(buf, data.len() as u32, LOCAL_DMA_LKEY)],
    );
}

#[test]
fn test_a_datagram_to_the_group_reaches_every_attached_member_with_its_grh() {
    let fabric = Fabric::with_manual_clock();
    let mut nodes: Vec<Gsi> = (0..4).map(|_| gsi(&fabric)).collect();
    let mut uds: Vec<Ud> = nodes.iter_mut().map(|g| ud(g, 2, 2048)).collect();
    // Nodes 0-2 join through the SA; node 3 only attaches (no join: the fabric does not
    // forward to it); node 2 joins but does not attach (its port gets it, no QP takes it).
    for (i, (g, u)) in nodes.iter_mut().zip(&uds).enumerate() {
        let mlid = if i < 3 {
            join_broadcast(g, i as u64)
        } else {
            0xc000
        };
        if i != 2 {
            let (st, _) = g.d.cmd(
                CMD_ATTACH_MCAST,
                &mcast(u.qp.qpn, IPOIB_BROADCAST_MGID, mlid),
            );
            assert_eq!(st, CMD_OK);
        }
    }
    let data = pattern(1000, 5);
    let (first, rest) = nodes.split_at_mut(1);
    send_to(&mut first[0], &mut uds[0], 0xc000, &data);
    let sender_gid = port_gid(first[0].guid);
    let sender_qpn = uds[0].qp.qpn;
    for (i, (g, u)) in std::iter::once(&mut first[0])
        .chain(rest.iter_mut())
        .zip(uds.iter_mut())
        .enumerate()
    {
        let got: Vec<HcaCqe> =
            g.d.drain_cq(&mut u.cq)
                .into_iter()
                .filter(|c| u32::from(c.opcode) == CQE_OP_RECV)
                .collect();
        if i >= 2 {
            assert!(got.is_empty(), "node {i}: not a receiving member");
            continue;
        }
        // The sender's own attached QP gets it too (IPoIB drops its own by SLID and QPN).
        assert_eq!(got.len(), 1, "node {i}");
        let c = got[0];
        assert_eq!(u32::from(c.flags) & CQE_FLAG_GRH, CQE_FLAG_GRH);
        assert_eq!((c.byte_len, c.src_qp), (1040, sender_qpn));
        let grh = g.d.read(u.bufs[c.wr_id as usize], 40);
        assert_eq!(
            (grh[0] >> 4, grh[6]),
            (6, 0x1b),
            "IPv6-shaped, next header IBA"
        );
        assert_eq!(grh[8..24], sender_gid, "SGID: the sender's port");
        assert_eq!(grh[24..40], IPOIB_BROADCAST_MGID, "DGID: the group");
        assert_eq!(g.d.read(u.bufs[c.wr_id as usize] + 40, 1000), data);
    }
}

#[test]
fn test_attachments_are_checked_and_go_with_their_qp() {
    let fabric = Fabric::with_manual_clock();
    let mut g = gsi(&fabric);
    let u = ud(&mut g, 1, 256);
    let m = IPOIB_BROADCAST_MGID;
    let cases = [
        (mcast(u.qp.qpn, m, 0xbfff), CMD_BAD_PARAM, "a unicast LID"),
        (
            mcast(u.qp.qpn, m, 0xffff),
            CMD_BAD_PARAM,
            "the permissive LID",
        ),
        (
            mcast(u.qp.qpn, [0; 16], 0xc000),
            CMD_BAD_PARAM,
            "not a multicast GID",
        ),
        (mcast(g.qp.qpn, m, 0xc000), CMD_BAD_PARAM, "the GSI QP"),
        (mcast(77, m, 0xc000), CMD_BAD_HANDLE, "no such QP"),
    ];
    for (c, want, why) in cases {
        assert_eq!(g.d.cmd(CMD_ATTACH_MCAST, &c).0, want, "{why}");
    }
    let ok = mcast(u.qp.qpn, m, 0xc000);
    assert_eq!(g.d.cmd(CMD_ATTACH_MCAST, &ok).0, CMD_OK);
    assert_eq!(
        g.d.cmd(CMD_ATTACH_MCAST, &ok).0,
        CMD_BUSY,
        "attached already"
    );
    assert_eq!(g.d.cmd(CMD_DETACH_MCAST, &ok).0, CMD_OK);
    assert_eq!(
        g.d.cmd(CMD_DETACH_MCAST, &ok).0,
        CMD_BAD_PARAM,
        "not attached"
    );
    // A full table refuses; destroying the QP frees its attachments.
    for i in 0..MAX_MCAST_ATTACH {
        let mut mg = m;
        mg[12..].copy_from_slice(&i.to_be_bytes());
        let c = mcast(u.qp.qpn, mg, 0xc000 + (i % 0x3000) as u16);
        assert_eq!(g.d.cmd(CMD_ATTACH_MCAST, &c).0, CMD_OK);
    }
    let one_more = mcast(u.qp.qpn, [0xff; 16], 0xc000);
    assert_eq!(g.d.cmd(CMD_ATTACH_MCAST, &one_more).0, CMD_NO_RESOURCES);
    assert_eq!(
        g.d.cmd_raw(CMD_DESTROY_QP, &u.qp.qpn.to_le_bytes(), 0).0,
        CMD_OK
    );
    let u2 = ud(&mut g, 1, 256);
    let again = mcast(u2.qp.qpn, [0xff; 16], 0xc000);
    assert_eq!(g.d.cmd(CMD_ATTACH_MCAST, &again).0, CMD_OK);
}

#[test]
fn test_a_datagram_too_long_for_the_receive_is_dropped_and_the_qp_goes_on() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let mut b = gsi(&fabric);
    let mut ua = ud(&mut a, 0, 0);
    let mut ub = ud(&mut b, 1, 100);
    let dlid = b.d.lid();
    let unicast = |g: &mut Gsi, u: &mut Ud, len: usize| {
        let buf = g.d.alloc(len as u64, 64);
        g.d.write(buf, &pattern(len, 1));
        let mut wr = send_wr(1, WR_SEND, 0);
        wr.ud_dlid = dlid;
        wr.ud_remote_qpn = 2;
        wr.ud_qkey = IPOIB_QKEY;
        g.d.post_send(&mut u.qp, wr, &[sge(buf, len as u32, LOCAL_DMA_LKEY)]);
    };
    unicast(&mut a, &mut ua, 1000);
    assert!(
        b.d.drain_cq(&mut ub.cq).is_empty(),
        "dropped, no completion"
    );
    assert_eq!(
        b.d.qp_state(ub.qp.qpn),
        QPS_RTS,
        "a remote sender cannot break the QP"
    );
    unicast(&mut a, &mut ua, 100);
    let c = b.d.drain_cq(&mut ub.cq);
    assert_eq!(
        (c.len(), c[0].byte_len, c[0].wr_id),
        (1, 140, 0),
        "the same WQE"
    );
}

/// Capability bits the driver sets (as ib_modify_port does) show in the SA's PortInfoRecord.
#[test]
fn test_a_port_info_record_carries_the_capabilities_the_driver_set() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let mut b = gsi(&fabric);
    let caps = 1 << 16 | 1 << 19; // CM and device management (ib_cm, ib_srpt)
    let set = HcaCmdPortCap {
        cap_mask: caps,
        rsvd: 0,
    };
    assert_eq!(b.d.cmd(CMD_SET_PORT_CAP, &set).0, CMD_OK);
    // PortInfoRecord Get by EndPortLID (component bit 0).
    let mut q = sa_mad(0x01, 0x0012, 1, 7);
    q[56..58].copy_from_slice(&b.d.lid().to_be_bytes());
    let r = ask(&mut a, &q);
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0);
    let pi = &r[56 + 4..];
    assert_eq!(u32::from_be_bytes(pi[20..24].try_into().unwrap()), caps);
    assert_eq!(pi[32] & 0xf, 4, "Active");
}

/// Takes one port's link down while a flag says so.
struct LinkDown {
    lid: u16,
    down: std::sync::atomic::AtomicBool,
}

impl hca_model::LinkHook for LinkDown {
    fn on_packet(
        &self,
        _: hca_model::LinkId,
        _: u64,
        _: &mut hca_model::packet::Packet,
    ) -> hca_model::Verdict {
        hca_model::Verdict::Pass
    }
    fn link_up(&self, lid: u16, _: u64) -> bool {
        lid != self.lid || !self.down.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A guest that subscribed to traps 64 and 65 hears, on its QP1, a port go out of service
/// and come back, as srp_daemon does.
#[test]
fn test_a_subscriber_hears_a_port_go_out_of_service_and_back() {
    use std::sync::atomic::Ordering::Relaxed;
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let b = gsi(&fabric);
    for (tid, trap) in [(1u64, 64u16), (2, 65)] {
        let mut q = sa_mad(0x02, 0x0003, 0, tid);
        let d = &mut q[56..];
        d[16..18].copy_from_slice(&0xffffu16.to_be_bytes());
        d[22] = 1; // generic
        d[23] = 1; // subscribe
        d[26..28].copy_from_slice(&trap.to_be_bytes());
        d[28..32].copy_from_slice(&(GSI_QPN << 8).to_be_bytes());
        let r = ask(&mut a, &q);
        assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0));
    }
    let hook = std::sync::Arc::new(LinkDown {
        lid: b.d.lid(),
        down: false.into(),
    });
    fabric.set_hook(Some(hook.clone()));
    let rbuf = a.d.alloc(2 * 296, 64);
    for i in 0..2u64 {
        a.d.post_recv(
            &mut a.qp,
            10 + i,
            &[sge(rbuf + i * 296, 296, LOCAL_DMA_LKEY)],
        );
    }
    for (i, (down, trap)) in [(true, 65u16), (false, 64)].into_iter().enumerate() {
        hook.down.store(down, Relaxed);
        fabric.advance(std::time::Duration::from_millis(2));
        let got = a.d.drain_cq(&mut a.cq);
        assert_eq!(got.len(), 1, "one Report for trap {trap}");
        assert_eq!((got[0].slid, got[0].src_qp), (SM_LID, GSI_QPN));
        let m = a.d.read(rbuf + i as u64 * 296 + 40, 256);
        assert_eq!(
            (m[1], m[3], &m[16..18]),
            (0x03, 0x06, &[0u8, 2][..]),
            "SA Report(Notice)"
        );
        assert_eq!(u16::from_be_bytes([m[56 + 4], m[56 + 5]]), trap);
        assert_eq!(m[56 + 16..56 + 32], port_gid(b.guid), "about node b");
    }
}

/// A node that joins the fabric, or leaves it (killed), is reported too: trap 64 when its
/// port attaches, 65 when it goes.
#[test]
fn test_a_subscriber_hears_a_node_arrive_and_leave() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let mut q = sa_mad(0x02, 0x0003, 0, 1);
    let d = &mut q[56..];
    d[16..18].copy_from_slice(&0xffffu16.to_be_bytes());
    (d[22], d[23]) = (1, 1); // generic, subscribe
    d[26..28].copy_from_slice(&0xffffu16.to_be_bytes()); // every trap
    d[28..32].copy_from_slice(&(GSI_QPN << 8).to_be_bytes());
    assert_eq!(
        u16::from_be_bytes(ask(&mut a, &q)[4..6].try_into().unwrap()),
        0
    );
    let rbuf = a.d.alloc(2 * 296, 64);
    for i in 0..2u64 {
        a.d.post_recv(
            &mut a.qp,
            10 + i,
            &[sge(rbuf + i * 296, 296, LOCAL_DMA_LKEY)],
        );
    }
    let c = gsi(&fabric);
    let guid = c.guid;
    c.d.hca.detach();
    fabric.advance(std::time::Duration::from_millis(2));
    let got = a.d.drain_cq(&mut a.cq);
    assert_eq!(got.len(), 2, "{got:?}");
    for (i, trap) in [64u16, 65].into_iter().enumerate() {
        let m = a.d.read(rbuf + i as u64 * 296 + 40, 256);
        assert_eq!(u16::from_be_bytes([m[56 + 4], m[56 + 5]]), trap);
        assert_eq!(m[56 + 16..56 + 32], port_gid(guid));
    }
}

/// PathRecord Get from `g` to the port with GUID `to`, in the partition of `pkey` if given:
/// the MAD status and, when found, the path's P_Key.
fn path_in(g: &mut Gsi, to: u64, pkey: Option<u16>, tid: u64) -> (u16, u16) {
    let mask = 1 << 2 | pkey.map_or(0, |_| 1 << 13);
    let mut q = sa_mad(0x01, 0x0035, mask, tid);
    q[56 + 8..56 + 24].copy_from_slice(&port_gid(to));
    if let Some(k) = pkey {
        q[56 + 50..56 + 52].copy_from_slice(&k.to_be_bytes());
    }
    let r = ask(g, &q);
    (
        u16::from_be_bytes([r[4], r[5]]),
        u16::from_be_bytes([r[56 + 50], r[56 + 51]]),
    )
}

#[test]
fn test_paths_and_groups_lie_in_partitions_their_ports_are_members_of() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let b = gsi(&fabric);
    let mut c = gsi(&fabric);
    let in_part = vec![a.d.lid(), b.d.lid()];
    fabric
        .set_partitions(&[Partition {
            pkey: 0x8001,
            members: in_part,
            limited: vec![],
        }])
        .unwrap();
    // A and B share partition 1; C is in the default partition only.
    assert_eq!(path_in(&mut a, b.guid, Some(0x8001), 1), (0, 0x8001));
    assert_eq!(path_in(&mut a, b.guid, None, 2), (0, 0xffff));
    assert_ne!(
        path_in(&mut a, c.guid, Some(0x8001), 3).0,
        0,
        "C is not in it"
    );
    assert_ne!(
        path_in(&mut c, b.guid, Some(0x8001), 4).0,
        0,
        "nor may C ask"
    );
    assert_eq!(path_in(&mut c, b.guid, None, 5), (0, 0xffff));
    // The partition's IPoIB broadcast group, which the SA made (IPoIB joins it as it
    // joins the default's, naming MGID, port, P_Key and join state, creating nothing): A
    // joins it; C may not.
    let mut mgid = IPOIB_BROADCAST_MGID;
    mgid[4..6].copy_from_slice(&0x8001u16.to_be_bytes());
    let join = |g: &mut Gsi, tid: u64| {
        let mut q = sa_mad(0x02, 0x0038, 1 | 2 | 1 << 7 | 1 << 16, tid);
        q[56..72].copy_from_slice(&mgid);
        q[72..88].copy_from_slice(&port_gid(g.guid));
        q[56 + 40..56 + 42].copy_from_slice(&0x8001u16.to_be_bytes());
        q[56 + 48] = 1;
        let r = ask(g, &q);
        u16::from_be_bytes([r[4], r[5]])
    };
    assert_eq!(join(&mut a, 6), 0, "a member joins");
    assert_ne!(
        join(&mut c, 7),
        0,
        "a port outside the partition may not join"
    );
    let members = fabric.with_sa(|sa| {
        sa.groups()
            .find(|g| g.mgid == mgid)
            .map(|g| g.members.len())
    });
    assert_eq!(members, Some(1));
    assert_eq!(
        fabric.partitions(),
        [Partition {
            pkey: 0x8001,
            members: vec![a.d.lid(), b.d.lid()],
            limited: vec![],
        }]
    );
}

/// A Performance Management MAD for the switch: `attr` with PortSelect `port` and
/// CounterSelect `select`.
fn pma_mad(method: u8, attr: u16, port: u8, select: u16, tid: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x04, 1, method]);
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[65] = port;
    m[66..68].copy_from_slice(&select.to_be_bytes());
    m
}

fn be32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// PortCounters' (XmitData, RcvData, XmitPkts, RcvPkts) in an answer.
fn port_counters(r: &[u8]) -> [u64; 4] {
    [88, 92, 96, 100].map(|at| u64::from(be32_at(r, at)))
}

/// The switch port's view of node port counters `c`: (XmitData, RcvData, XmitPkts,
/// RcvPkts), what the node received being what the switch sent.
fn seen_from_switch(c: &[u64; COUNTERS_LEN as usize]) -> [u64; 4] {
    let at = |i: u32| c[i as usize];
    [
        at(CTR_RX_OCTETS) / 4,
        at(CTR_TX_OCTETS) / 4,
        at(CTR_RX_PACKETS),
        at(CTR_TX_PACKETS),
    ]
}

/// `perfquery 49151 N` and `ibqueryerrors` ask the switch's PMA on QP1: switch port n's
/// counters are the link's to the node at LID n, from the switch's end; a Set resets the
/// counters it selects for the switch's view only; AllPortSelect sums every port.
#[test]
fn test_the_switch_pma_counts_each_link_from_the_switch_end() {
    let fabric = Fabric::with_manual_clock();
    let mut a = gsi(&fabric);
    let mut b = gsi(&fabric);
    let (la, lb) = (a.d.lid(), b.d.lid());
    assert_eq!((la, lb), (1, 2));
    // Traffic on b's link: b asks the SA five times.
    let gid_a = port_gid(a.guid);
    let path = move |tid| {
        let mut q = sa_mad(0x01, 0x0035, 1 << 2, tid);
        q[56 + 8..56 + 24].copy_from_slice(&gid_a);
        q
    };
    for tid in 0..5 {
        ask(&mut b, &path(tid));
    }
    // Port 2 is b's link: nothing moves on it while a asks.
    let r = ask(&mut a, &pma_mad(0x01, 0x0012, 2, 0, 1));
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0));
    let cb = fabric.counters(lb).unwrap();
    assert_eq!(port_counters(&r), seen_from_switch(&cb));
    assert_eq!(port_counters(&r)[2], 5, "the SA's five answers");
    // Port 1 is the asker's own link: its query had arrived, its answer was not yet sent.
    let r = ask(&mut a, &pma_mad(0x01, 0x0012, 1, 0, 2));
    let after = seen_from_switch(&fabric.counters(la).unwrap());
    let got = port_counters(&r);
    assert_eq!((got[1], got[2] + 1, got[3]), (after[1], after[2], after[3]));
    assert!(got[0] < after[0]);
    // PortCountersExtended: the same, 64 bits wide.
    let r = ask(&mut a, &pma_mad(0x01, 0x001d, 2, 0, 3));
    let ext = [72, 80, 88, 96].map(|at| be64_at(&r, at));
    assert_eq!(ext, seen_from_switch(&cb));
    // A Set resets XmitPkts (bit 14) of switch port 2: from 0 again, the node's own
    // counter untouched.
    let r = ask(&mut a, &pma_mad(0x02, 0x0012, 2, 1 << 14, 4));
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0);
    assert_eq!(port_counters(&r)[2], 0);
    assert_eq!(fabric.counters(lb).unwrap(), cb);
    for tid in 5..8 {
        ask(&mut b, &path(tid));
    }
    let r = ask(&mut a, &pma_mad(0x01, 0x0012, 2, 0, 5));
    let now = seen_from_switch(&fabric.counters(lb).unwrap());
    assert_eq!(port_counters(&r)[2], 3);
    assert_eq!(port_counters(&r)[3], now[3], "not reset");
    // Every port at once: the sum over ports 0 (management), 1 and 2. Asking port 1 on
    // its own next, the asker's link had moved one more MAD each way.
    let all = port_counters(&ask(&mut a, &pma_mad(0x01, 0x0012, 0xff, 0, 6)));
    let one = port_counters(&ask(&mut a, &pma_mad(0x01, 0x0012, 1, 0, 7)));
    let two = port_counters(&ask(&mut a, &pma_mad(0x01, 0x0012, 2, 0, 8)));
    assert_eq!(all[2] + 1, one[2] + two[2]);
    assert_eq!(all[3] + 1, one[3] + two[3]);
    // ClassPortInfo: AllPortSelect and PortCountersExtended.
    let r = ask(&mut a, &pma_mad(0x01, 0x0001, 0, 0, 9));
    assert_eq!(u16::from_be_bytes([r[66], r[67]]) & 0x0300, 0x0300);
    // A port past the switch's: invalid field; another attribute: not supported.
    let r = ask(&mut a, &pma_mad(0x01, 0x0012, 3, 0, 10));
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x1c);
    let r = ask(&mut a, &pma_mad(0x01, 0x0016, 1, 0, 11));
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x0c);
}
