//! A subnet a user's SM manages (`Fabric::set_guest_sm`, `sm = "guest"`): the test plays
//! OpenSM from node 1's QP0 (directed-route SMPs to the switch) and the HCAs' agents
//! (SMP_SET, as hca_ib's sma.c hands the Sets to the device). The ports wait in INIT and
//! pass no data until the SM arms and activates them; the switch forwards unicast by the
//! LFT the SM set and multicast by its MFT, no further; the switch's and the ports' M_Keys
//! keep out an SM without them.

use std::time::Duration;

use hca_model::abi::*;
use hca_model::fabric::UserSmError;
use hca_model::sa::SM_LID;
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::Fabric;
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);
const MTU_1024: u8 = 3;
const PORT_INFO: u16 = 0x0015;
const SWITCH_INFO: u16 = 0x0012;
const LFT: u16 = 0x0019;
const MFT: u16 = 0x001b;
const SM_INFO: u16 = 0x0020;
const SET: u8 = 0x02;
const GET: u8 = 0x01;
/// The SMP status of a field the switch cannot take.
const INVALID_FIELD: u16 = 7 << 2;
const MLID: u16 = 0xc001;
const MGID: [u8; 16] = [0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// Advances virtual time until `cq` gave `n` CQEs or `limit` passed.
fn collect(f: &Fabric, d: &mut Driver, cq: &mut CqH, n: usize, limit: Duration) -> Vec<HcaCqe> {
    let start = f.now_ns();
    let mut got = d.drain_cq(cq);
    while got.len() < n && f.now_ns() - start < limit.as_nanos() as u64 {
        f.advance(MS);
        got.extend(d.drain_cq(cq));
    }
    got
}

/// The user's SM: QP0 on a node's HCA, sending directed-route SMPs one hop, to the switch.
struct Sm {
    qp0: QpH,
    cq: CqH,
    rbuf: u64,
    sbuf: u64,
    tid: u64,
}

impl Sm {
    fn on(d: &mut Driver) -> Sm {
        let pd = d.alloc_pd();
        let cq = d.create_cq(6);
        let qp0 = d.create_qp(QPT_SMI, pd, cq.cqn, cq.cqn);
        d.bring_up_ud(qp0.qpn, 0, true);
        let rbuf = d.alloc(296, 64);
        let sbuf = d.alloc(256, 64);
        Sm {
            qp0,
            cq,
            rbuf,
            sbuf,
            tid: 0,
        }
    }

    /// A Get or Set of `attr` at the switch; its answer (None: no answer).
    fn ask(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        (method, attr, attr_mod): (u8, u16, u32),
        data: &[u8],
        mkey: u64,
    ) -> Option<Vec<u8>> {
        self.tid += 1;
        let mut smp = [0u8; 256];
        // Directed route, hop pointer 1 of 1 (the sender moved it), out of port 1.
        (smp[0], smp[1], smp[2], smp[3], smp[6], smp[7]) = (1, 0x81, 1, method, 1, 1);
        smp[8..16].copy_from_slice(&self.tid.to_be_bytes());
        smp[16..18].copy_from_slice(&attr.to_be_bytes());
        smp[20..24].copy_from_slice(&attr_mod.to_be_bytes());
        smp[24..32].copy_from_slice(&mkey.to_be_bytes());
        smp[32..36].copy_from_slice(&[0xff; 4]);
        smp[64..64 + data.len()].copy_from_slice(data);
        smp[129] = 1;
        d.write(self.sbuf, &smp);
        d.post_recv(
            &mut self.qp0,
            self.tid,
            &[sge(self.rbuf, 296, LOCAL_DMA_LKEY)],
        );
        let mut wr = send_wr(1000 + self.tid, WR_SEND, WQE_SIGNALED);
        (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (0xffff, SMI_QPN, 0);
        d.post_send(&mut self.qp0, wr, &[sge(self.sbuf, 256, LOCAL_DMA_LKEY)]);
        let got = collect(f, d, &mut self.cq, 2, 10 * MS);
        let answered = got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV);
        if !answered {
            // (The receive stays posted, for the next answer: into the same buffer.)
            return None;
        }
        let ans = d.read(self.rbuf + 40, 256);
        assert_eq!(
            ans[8..16],
            self.tid.to_be_bytes(),
            "the answer keeps the TID"
        );
        Some(ans)
    }

    /// A Set at the switch: the answer's status (without the D bit) and data.
    fn set(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        attr: u16,
        m: u32,
        data: &[u8],
    ) -> (u16, Vec<u8>) {
        let a = self.ask(f, d, (SET, attr, m), data, 0).expect("an answer");
        (
            u16::from_be_bytes([a[4], a[5]]) & 0x7fff,
            a[64..128].to_vec(),
        )
    }
}

/// PortInfo with PortState `state` and MasterSMLID 1 (the rest: no change).
fn port_info(state: u8, lid: u16) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[16..18].copy_from_slice(&lid.to_be_bytes());
    d[18..20].copy_from_slice(&1u16.to_be_bytes());
    d[32] = state;
    d[36] = 5 << 4;
    d[43] = 1 << 4;
    d
}

/// The HCA's agent hands a PortInfo Set to its device, as sma.c does.
fn hca_set(d: &mut Driver, data: [u8; 64], mkey: u64) -> u32 {
    let smp = HcaCmdSmpSet {
        attr_id: PORT_INFO,
        attr_mod: 1,
        mkey,
        data,
        ..Default::default()
    };
    d.cmd(CMD_SMP_SET, &smp).0
}

fn port_attr(d: &mut Driver) -> HcaPortAttr {
    decode(&d.cmd_raw(CMD_QUERY_PORT, &[], 0).1)
}

/// A UD QP attached to the test's group, with a receive posted.
fn member(d: &mut Driver) -> (CqH, QpH, u64) {
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let mut qp = d.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    d.bring_up_ud(qp.qpn, 0xb, false);
    let mut m = HcaCmdMcast::default();
    (m.qpn, m.mgid, m.mlid) = (qp.qpn, MGID, MLID);
    assert_eq!(d.cmd(CMD_ATTACH_MCAST, &m).0, CMD_OK);
    let rbuf = d.alloc(40 + 64, 64);
    d.post_recv(&mut qp, 7, &[sge(rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
    (cq, qp, rbuf)
}

#[test]
fn test_a_user_sm_must_be_chosen_first_and_on_one_switch() {
    let f = Fabric::with_manual_clock();
    let mut d = Driver::new(Some(&f), 4);
    assert_eq!(f.set_guest_sm(), Err(UserSmError::PortsAttached));
    // The fabric's own SM manages the port: no Set changes it, whoever makes it.
    let a = port_attr(&mut d);
    assert_eq!((a.state, a.sm_lid, a.flags), (PORT_ACTIVE as u8, SM_LID, 0));
    assert_eq!(hca_set(&mut d, port_info(1, 1), 0), CMD_BAD_STATE);
    assert_eq!(port_attr(&mut d), a);
    let f = Fabric::with_manual_clock();
    let two = vec![
        SwitchSpec {
            name: "a".into(),
            hcas: vec![1],
        },
        SwitchSpec {
            name: "b".into(),
            hcas: vec![2],
        },
    ];
    f.set_topology(Topology::new(two, vec![(0, 1)]).unwrap());
    assert_eq!(f.set_guest_sm(), Err(UserSmError::Switches));
    assert!(!f.guest_sm());
}

#[test]
fn test_ports_pass_data_only_once_the_user_sm_activates_them_and_by_its_tables() {
    let f = Fabric::with_manual_clock();
    f.set_guest_sm().unwrap();
    let mut p = Pair::build(f.clone(), MTU_1024, ALL_ACCESS, (10, 7, 7));
    let mut c = Driver::new(Some(&f), 4);
    assert_eq!((p.a.lid(), p.b.lid(), c.lid()), (1, 2, 3));
    for d in [&mut p.a, &mut p.b, &mut c] {
        let a = port_attr(d);
        assert_eq!(
            (a.state, a.sm_lid, a.flags),
            (PORT_INIT as u8, 0, PORT_FLAG_GUEST_SM),
            "waits for an SM"
        );
        assert!(d
            .drain_eq(0)
            .iter()
            .all(|e| e.event_type != EV_PORT_ACTIVE as u8));
    }
    // Before the SM: an RC write is lost at the switch (its timer resends it).
    let src = p.a.alloc(8192, 64);
    let dst = p.b.alloc(8192, 64);
    p.a.write(
        src,
        &(0..8192u32).map(|i| (i * 7) as u8).collect::<Vec<_>>(),
    );
    let mut w = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    let lost = f.stats().unrouted;
    p.a.post_send(&mut p.qa, w, &[sge(src, 8192, p.key_a)]);
    f.advance(MS);
    assert!(f.stats().unrouted > lost, "no data through an INIT port");

    // The SM, from node 1: the switch runs no SM of its own.
    let mut sm = Sm::on(&mut p.a);
    let info = sm.ask(&f, &mut p.a, (GET, SM_INFO, 0), &[], 0).unwrap();
    assert_eq!(
        u16::from_be_bytes([info[4], info[5]]) & 0x7fff,
        0x0c,
        "no SMInfo"
    );
    let pi0 = sm.ask(&f, &mut p.a, (GET, PORT_INFO, 0), &[], 0).unwrap();
    assert_eq!(pi0[64 + 23] & 2, 0, "port 0 is not IsSM");
    let before = sm.ask(&f, &mut p.a, (GET, SWITCH_INFO, 0), &[], 0).unwrap();
    assert_eq!(before[64 + 11] & 4, 4, "PortStateChange: ports came up");
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&SM_LID.to_be_bytes());
    // LifeTimeValue 0x12; PortStateChange written back clears it.
    si[11] = 0x12 << 3 | 4;
    let (st, got) = sm.set(&f, &mut p.a, SWITCH_INFO, 0, &si);
    assert_eq!(
        (st, &got[6..8], got[11]),
        (0, &SM_LID.to_be_bytes()[..], 0x90)
    );
    // LFT block 0, with LID 2 sent out of port 3 by mistake.
    let mut block = [0xffu8; 64];
    (block[1], block[2], block[3]) = (1, 3, 3);
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let mut past = block;
    past[4] = 9;
    assert_eq!(
        sm.set(&f, &mut p.a, LFT, 0, &past).0,
        INVALID_FIELD,
        "no port 9"
    );
    assert_eq!(
        sm.set(&f, &mut p.a, LFT, 768, &block).0,
        INVALID_FIELD,
        "past 0xbfff"
    );
    for port in 1..=3u32 {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            let (st, got) = sm.set(&f, &mut p.a, PORT_INFO, port, &port_info(state as u8, 0));
            assert_eq!((st, got[32] & 0xf), (0, state as u8), "switch port {port}");
        }
    }
    assert_eq!(
        sm.set(&f, &mut p.a, PORT_INFO, 1, &port_info(PORT_ARMED as u8, 0))
            .0,
        INVALID_FIELD,
        "ACTIVE goes back only through DOWN"
    );
    // The HCAs' agents: LID kept, SM at LID 1; ACTIVE only after ARMED.
    for (d, lid) in [(&mut p.a, 1u16), (&mut p.b, 2), (&mut c, 3)] {
        d.drain_eq(0);
        assert_eq!(
            hca_set(d, port_info(PORT_ACTIVE as u8, lid), 0),
            CMD_BAD_PARAM
        );
        assert_eq!(
            hca_set(d, port_info(0, lid + 1), 0),
            CMD_BAD_PARAM,
            "a LID it is not at"
        );
        assert_eq!(hca_set(d, port_info(PORT_ARMED as u8, lid), 0), CMD_OK);
        assert_eq!(hca_set(d, port_info(PORT_ACTIVE as u8, lid), 0), CMD_OK);
        let a = port_attr(d);
        assert_eq!((a.state, a.lid, a.sm_lid), (PORT_ACTIVE as u8, lid, 1));
        let ev: Vec<(u8, u32)> = (d.drain_eq(0).iter())
            .map(|e| (e.event_type, e.data))
            .collect();
        assert!(
            ev.contains(&(EV_PORT_CHANGE as u8, PORT_CHANGE_SM)),
            "{ev:?}"
        );
        assert!(ev.iter().any(|e| e.0 == EV_PORT_ACTIVE as u8), "{ev:?}");
    }
    // Every port ACTIVE, but LID 2's entry names port 3: the write is still lost.
    let lost = f.stats().unrouted;
    f.advance(50 * MS);
    assert!(
        f.stats().unrouted > lost,
        "forwarded by the SM's table, to the wrong port"
    );
    block[2] = 2;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(done.iter().map(|c| c.status).collect::<Vec<_>>(), [0]);
    assert_eq!(p.b.read(dst, 8192), p.a.read(src, 8192));
    // An entry of 0 (the switch itself) for an HCA's LID delivers nothing there.
    let send = |p: &mut Pair, id: u64| {
        let mut w = send_wr(id, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
    };
    block[2] = 0;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let lost = f.stats().unrouted;
    send(&mut p, 2);
    f.advance(MS);
    assert!(
        f.stats().unrouted > lost,
        "not to LID 2 by the switch's port 0"
    );
    block[2] = 2;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!((done.len(), done[0].status), (1, 0));
    // The SM sets switch port 2 Down: the link retrains, node 2's port is INIT again (its
    // driver hears PORT_DOWN) and nothing passes until the SM activates both ends.
    p.b.drain_eq(0);
    assert_eq!(sm.set(&f, &mut p.a, PORT_INFO, 2, &port_info(1, 0)).0, 0);
    assert_eq!(port_attr(&mut p.b).state, PORT_INIT as u8);
    assert!(p
        .b
        .drain_eq(0)
        .iter()
        .any(|e| e.event_type == EV_PORT_DOWN as u8));
    let lost = f.stats().unrouted;
    send(&mut p, 3);
    f.advance(MS);
    assert!(f.stats().unrouted > lost, "no data through a port set Down");
    for state in [PORT_ARMED, PORT_ACTIVE] {
        assert_eq!(
            sm.set(&f, &mut p.a, PORT_INFO, 2, &port_info(state as u8, 0))
                .0,
            0
        );
        assert_eq!(hca_set(&mut p.b, port_info(state as u8, 2), 0), CMD_OK);
    }
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(
        (done.len(), done[0].status),
        (1, 0),
        "once both ends are ACTIVE"
    );
    // Node 2's agent takes a Down: its switch port goes back to INIT too.
    assert_eq!(hca_set(&mut p.b, port_info(1, 2), 0), CMD_OK);
    let pi = sm.ask(&f, &mut p.a, (GET, PORT_INFO, 2), &[], 0).unwrap();
    assert_eq!(pi[64 + 32] & 0xf, PORT_INIT as u8, "switch port 2");

    // Multicast by the MFT: MLID 0xc001 to ports 1 and 3, not 2 (whose QP is attached).
    let mut members: Vec<(CqH, QpH, u64)> = [&mut p.a, &mut p.b, &mut c]
        .into_iter()
        .map(member)
        .collect();
    let mut mft = [0u8; 64];
    mft[2..4].copy_from_slice(&0b1010u16.to_be_bytes());
    assert_eq!(sm.set(&f, &mut p.a, MFT, 0, &mft).0, 0);
    let sbuf = c.alloc(64, 64);
    c.write(sbuf, b"by the multicast table");
    let mut wr = ud_send_wr(MLID, 0x00ff_ffff, 0xb);
    wr.wr_id = 9;
    let (_, qp_c, _) = &mut members[2];
    c.post_send(qp_c, wr, &[sge(sbuf, 22, LOCAL_DMA_LKEY)]);
    f.advance(5 * MS);
    let got: Vec<bool> = [&mut p.a, &mut p.b, &mut c]
        .into_iter()
        .zip(&mut members)
        .map(|(d, (cq, _, _))| (d.drain_cq(cq).iter()).any(|e| u32::from(e.opcode) == CQE_OP_RECV))
        .collect();
    assert_eq!(got, [true, false, true], "to the ports the MFT names");
    assert_eq!(p.a.read(members[0].2 + 40, 22), b"by the multicast table");
}

#[test]
fn test_m_keys_keep_out_an_sm_without_them() {
    let f = Fabric::with_manual_clock();
    f.set_guest_sm().unwrap();
    let mut a = Driver::new(Some(&f), 4);
    let mut sm = Sm::on(&mut a);
    // The switch's port 0 takes an M_Key; then a Set without it gets no answer at all.
    let key = 0x5eed_0000_0000_0001u64;
    let mut p0 = port_info(0, SM_LID);
    p0[..8].copy_from_slice(&key.to_be_bytes());
    assert_eq!(sm.set(&f, &mut a, PORT_INFO, 0, &p0).0, 0);
    let armed = port_info(PORT_ARMED as u8, 0);
    assert!(sm.ask(&f, &mut a, (SET, PORT_INFO, 1), &armed, 0).is_none());
    // Every attribute: the tables stay as they were.
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&100u16.to_be_bytes());
    for (attr, data) in [
        (SWITCH_INFO, &si[..]),
        (LFT, &[1u8; 64][..]),
        (MFT, &[0xffu8; 64][..]),
    ] {
        assert!(
            sm.ask(&f, &mut a, (SET, attr, 0), data, 0).is_none(),
            "{attr:#x}"
        );
    }
    let lft = sm.ask(&f, &mut a, (GET, LFT, 0), &[], 0).unwrap();
    assert_eq!(lft[64..128], [0xff; 64], "no LID forwarded");
    assert_eq!(f.user_sm_tables().unwrap().top(), 0);
    let ok = sm
        .ask(&f, &mut a, (SET, PORT_INFO, 1), &armed, key)
        .unwrap();
    assert_eq!(
        (ok[4], ok[5] & 0x7f, ok[64 + 32] & 0xf),
        (0x80, 0, PORT_ARMED as u8)
    );
    let mut moved = p0;
    moved[16..18].copy_from_slice(&5u16.to_be_bytes());
    let refused = sm
        .ask(&f, &mut a, (SET, PORT_INFO, 0), &moved, key)
        .unwrap();
    assert_eq!(
        u16::from_be_bytes([refused[4], refused[5]]) & 0x7fff,
        INVALID_FIELD,
        "the switch keeps its LID"
    );
    // The HCA's port likewise.
    let mut with_key = port_info(0, 1);
    with_key[..8].copy_from_slice(&key.to_be_bytes());
    assert_eq!(hca_set(&mut a, with_key, 0), CMD_OK);
    assert_eq!(port_attr(&mut a).mkey, key);
    assert_eq!(
        hca_set(&mut a, port_info(PORT_ARMED as u8, 1), 7),
        CMD_BAD_KEY
    );
    assert_eq!(port_attr(&mut a).state, PORT_INIT as u8);
    assert_eq!(hca_set(&mut a, port_info(PORT_ARMED as u8, 1), key), CMD_OK);
}
