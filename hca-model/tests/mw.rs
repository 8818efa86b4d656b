//! Memory windows: a key for remote access to part of an MR, with rights of its own, bound
//! and unbound by the consumer through its send queue. Type 1 is rebound at will by any QP
//! of its PD; type 2 answers only the QP that bound it, and is unbound by LOCAL_INV or a
//! peer's SEND with Invalidate. While a window is bound its MR cannot go.

use hca_model::abi::*;
use hca_test_driver::*;

const MTU_4096: u8 = 5;
const LEN: u64 = 8192;

/// A pair, and on B an MR that lets windows be bound to it, and a window of `mw_type`.
struct Setup {
    p: Pair,
    /// B's buffer, its MR's key, and the window's key as allocated.
    buf: u64,
    mr: u32,
    mw: u32,
}

fn setup(mw_type: u32) -> Setup {
    let mut p = Pair::new(MTU_4096);
    let buf = p.b.alloc(LEN, 4096);
    let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_MW_BIND;
    let mr = p.b.reg_mr(p.pd_b, buf, LEN, access);
    let mw = p.b.alloc_mw(p.pd_b, mw_type).unwrap();
    Setup { p, buf, mr, mw }
}

/// The key after `key`: the same index, the next tag (ibv_inc_rkey).
fn next_key(key: u32) -> u32 {
    (key & !0xff) | ((key + 1) & 0xff)
}

/// B binds window `mw` to `[buf + off, buf + off + len)` of its MR with `access`, as key `new_key`,
/// through its QP; the bind's completion status.
fn bind(s: &mut Setup, new_key: u32, off: u64, len: u64, access: u32) -> u32 {
    let w = HcaBindMwWqe {
        wr_id: 7,
        flags: WQE_SIGNALED as u8,
        access,
        addr: s.buf + off,
        length: len,
        mw_key: s.mw,
        new_key,
        mr_key: s.mr,
        ..Default::default()
    };
    s.p.b.post_bind_mw(&mut s.p.qb, w);
    let c = s.p.b.drain_cq(&mut s.p.cq_b);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].wr_id, 7);
    if u32::from(c[0].status) == WC_SUCCESS {
        assert_eq!(u32::from(c[0].opcode), CQE_OP_BIND_MW);
    }
    c[0].status.into()
}

/// A's RDMA `op` (WRITE or READ) of `len` bytes at `remote` under `rkey`; its status.
fn rdma(p: &mut Pair, op: u32, remote: u64, rkey: u32, len: u32) -> u32 {
    let local = p.a.alloc(u64::from(len), 64);
    p.a.write(local, &pattern(len as usize, 3));
    let mut wr = send_wr(1, op, WQE_SIGNALED);
    (wr.remote_addr, wr.rkey) = (remote, rkey);
    let key = p.key_a;
    p.a.post_send(&mut p.qa, wr, &[sge(local, len, key)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    c.last().map_or(u32::MAX, |c| c.status.into())
}

/// A pair whose QPs failed (a remote access error) is no use: a new one for the next step.
fn reconnect(s: &mut Setup) {
    let (qa, qb) = s.p.connect_more((s.p.cq_a.cqn, s.p.cq_b.cqn), 6, 0);
    (s.p.qa, s.p.qb) = (qa, qb);
}

#[test]
fn test_a_type_1_window_grants_its_range_and_rights_until_rebound_empty() {
    let mut s = setup(MW_TYPE_1);
    let key = next_key(s.mw);
    let (at, len) = (s.buf + 4096, 2048);
    assert_eq!(
        bind(&mut s, key, 4096, len, ACCESS_REMOTE_WRITE),
        WC_SUCCESS
    );
    assert_eq!(rdma(&mut s.p, WR_RDMA_WRITE, at, key, 2048), WC_SUCCESS);
    assert_eq!(s.p.b.read(at, 2048), pattern(2048, 3));
    // Outside the window, though inside the MR.
    assert_eq!(
        rdma(&mut s.p, WR_RDMA_WRITE, at - 64, key, 64),
        WC_REM_ACCESS_ERR
    );
    reconnect(&mut s);
    // A right the window does not grant (the MR would).
    assert_eq!(rdma(&mut s.p, WR_RDMA_READ, at, key, 64), WC_REM_ACCESS_ERR);
    reconnect(&mut s);
    // The old key is no longer the window's once it is bound anew; an empty binding
    // grants nothing.
    let key2 = next_key(key);
    assert_eq!(bind(&mut s, key2, 0, 0, 0), WC_SUCCESS);
    assert_eq!(
        rdma(&mut s.p, WR_RDMA_WRITE, at, key2, 64),
        WC_REM_ACCESS_ERR
    );
}

#[test]
fn test_a_type_2_window_serves_only_its_qp_and_is_not_bound_twice() {
    let mut s = setup(MW_TYPE_2);
    let key = next_key(s.mw);
    let rights = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
    assert_eq!(bind(&mut s, key, 0, LEN, rights), WC_SUCCESS);
    assert_eq!(rdma(&mut s.p, WR_RDMA_READ, s.buf, key, 512), WC_SUCCESS);
    // Bound already: a type 2 window must be invalidated before it is bound again.
    assert_eq!(bind(&mut s, next_key(key), 0, LEN, rights), WC_MW_BIND_ERR);
    // Another QP of the same PD on B: the window is not its.
    reconnect(&mut s);
    assert_eq!(
        rdma(&mut s.p, WR_RDMA_WRITE, s.buf, key, 64),
        WC_REM_ACCESS_ERR
    );
}

#[test]
fn test_local_invalidate_and_a_peers_send_with_invalidate_unbind_a_type_2_window() {
    for by_peer in [false, true] {
        let mut s = setup(MW_TYPE_2);
        let key = next_key(s.mw);
        assert_eq!(bind(&mut s, key, 0, LEN, ACCESS_REMOTE_WRITE), WC_SUCCESS);
        assert_eq!(rdma(&mut s.p, WR_RDMA_WRITE, s.buf, key, 64), WC_SUCCESS);
        if by_peer {
            let r = s.p.b.alloc(64, 64);
            let kb = s.p.key_b;
            s.p.b.post_recv(&mut s.p.qb, 40, &[sge(r, 64, kb)]);
            let mut wr = send_wr(2, WR_SEND_INV, WQE_SIGNALED);
            wr.imm = key;
            s.p.a.post_send(&mut s.p.qa, wr, &[]);
            assert_eq!(
                u32::from(s.p.a.drain_cq(&mut s.p.cq_a)[0].status),
                WC_SUCCESS
            );
            let got = s.p.b.drain_cq(&mut s.p.cq_b);
            assert_eq!(u32::from(got[0].flags) & CQE_FLAG_INV, CQE_FLAG_INV);
        } else {
            let mut wr = send_wr(3, WR_LOCAL_INV, WQE_SIGNALED);
            wr.imm = key;
            s.p.b.post_send(&mut s.p.qb, wr, &[]);
            let c = s.p.b.drain_cq(&mut s.p.cq_b);
            assert_eq!((c[0].wr_id, u32::from(c[0].status)), (3, WC_SUCCESS));
        }
        assert_eq!(
            rdma(&mut s.p, WR_RDMA_WRITE, s.buf, key, 64),
            WC_REM_ACCESS_ERR,
            "invalidated by the peer: {by_peer}"
        );
    }
}

/// A window that goes takes its access with it; the MR under a bound window cannot go.
#[test]
fn test_dealloc_ends_access_and_a_bound_mr_is_busy() {
    let mut s = setup(MW_TYPE_1);
    let key = next_key(s.mw);
    assert_eq!(bind(&mut s, key, 0, LEN, ACCESS_REMOTE_READ), WC_SUCCESS);
    let dereg = |p: &mut Pair, k: u32| {
        p.b.cmd(CMD_DEREG_MR, &HcaCmdHandle { handle: k, rsvd: 0 })
            .0
    };
    assert_eq!(dereg(&mut s.p, s.mr), CMD_BUSY);
    // A window's key is not an MR's to deregister.
    assert_eq!(dereg(&mut s.p, key), CMD_BAD_HANDLE);
    assert_eq!(rdma(&mut s.p, WR_RDMA_READ, s.buf, key, 64), WC_SUCCESS);
    let h = HcaCmdHandle {
        handle: key,
        rsvd: 0,
    };
    assert_eq!(s.p.b.cmd(CMD_DEALLOC_MW, &h).0, CMD_OK);
    assert_eq!(
        rdma(&mut s.p, WR_RDMA_READ, s.buf, key, 64),
        WC_REM_ACCESS_ERR
    );
    assert_eq!(dereg(&mut s.p, s.mr), CMD_OK);
}

/// What a bind may not do fails it with MW_BIND_ERR (and the QP goes to ERR), and a
/// window type the device does not have is refused.
#[test]
fn test_bad_binds_fail_and_bad_windows_are_refused() {
    type Spoil = fn(&mut Setup, &mut HcaBindMwWqe);
    let cases: [(&str, Spoil); 5] = [
        ("an MR without MW_BIND", |s, w| {
            let kb = s.p.b.reg_mr(s.p.pd_b, s.buf, LEN, ACCESS_LOCAL_WRITE);
            w.mr_key = kb;
        }),
        ("a range past the MR", |s, w| w.addr = s.buf + LEN - 16),
        ("a right IB does not have", |_, w| w.access = 1 << 6),
        ("a key of another window index", |_, w| {
            w.new_key = w.new_key.wrapping_add(0x100)
        }),
        ("a window of another PD", |s, w| {
            let pd = s.p.b.alloc_pd();
            w.mw_key = s.p.b.alloc_mw(pd, MW_TYPE_1).unwrap();
            w.new_key = next_key(w.mw_key);
        }),
    ];
    for (what, spoil) in cases {
        let mut s = setup(MW_TYPE_1);
        let mut w = HcaBindMwWqe {
            wr_id: 9,
            flags: WQE_SIGNALED as u8,
            access: ACCESS_REMOTE_READ,
            addr: s.buf,
            length: 64,
            mw_key: s.mw,
            new_key: next_key(s.mw),
            mr_key: s.mr,
            ..Default::default()
        };
        spoil(&mut s, &mut w);
        s.p.b.post_bind_mw(&mut s.p.qb, w);
        let c = s.p.b.drain_cq(&mut s.p.cq_b);
        assert_eq!(u32::from(c[0].status), WC_MW_BIND_ERR, "{what}");
        assert_eq!(s.p.b.qp_state(s.p.qb.qpn), QPS_ERR, "{what}");
    }
    let mut s = setup(MW_TYPE_1);
    let pd = s.p.pd_b;
    assert_eq!(s.p.b.alloc_mw(pd, 3), Err(CMD_BAD_PARAM));
    assert_eq!(s.p.b.alloc_mw(pd + 100, MW_TYPE_2), Err(CMD_BAD_HANDLE));
}

/// A type 2 window bound to a QP that is destroyed is unbound with it: a QP given the
/// same number later does not inherit it.
#[test]
fn test_a_destroyed_qps_type_2_windows_are_unbound() {
    let mut s = setup(MW_TYPE_2);
    let key = next_key(s.mw);
    assert_eq!(bind(&mut s, key, 0, LEN, ACCESS_REMOTE_READ), WC_SUCCESS);
    let qpn = s.p.qb.qpn;
    let h = HcaCmdHandle {
        handle: qpn,
        rsvd: 0,
    };
    assert_eq!(s.p.b.cmd(CMD_DESTROY_QP, &h).0, CMD_OK);
    // The MR is free again: nothing is bound to it.
    let h = HcaCmdHandle {
        handle: s.mr,
        rsvd: 0,
    };
    assert_eq!(s.p.b.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
}
