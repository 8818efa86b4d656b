//! The fabric's subnet administrator, asked the way ib_sa asks: a MAD from a guest's GSI QP to
//! the SM LID its port reports, the answer back on the same QP.

use hca_model::abi::*;
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

#[test]
fn test_members_join_the_broadcast_group_and_the_fabric_shows_them() {
    let fabric = Fabric::with_manual_clock();
    let mut nodes: Vec<Gsi> = (0..3).map(|_| gsi(&fabric)).collect();
    for (i, g) in nodes.iter_mut().enumerate() {
        let mut q = sa_mad(0x02, 0x0038, 1 | 2 | 1 << 7 | 1 << 16, i as u64);
        q[56..72].copy_from_slice(&IPOIB_BROADCAST_MGID);
        q[72..88].copy_from_slice(&port_gid(g.guid));
        q[56 + 40..56 + 42].copy_from_slice(&0xffffu16.to_be_bytes());
        q[56 + 48] = 1; // full member
        let r = ask(g, &q);
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0, "joined");
        assert_eq!(u16::from_be_bytes([r[56 + 36], r[56 + 37]]), 0xc000);
    }
    let members = fabric.with_sa(|sa| {
        sa.groups()
            .find(|g| g.mgid == IPOIB_BROADCAST_MGID)
            .map(|g| g.members.len())
    });
    assert_eq!(members, Some(3));
}
