//! Revocation is checked when bytes move: once DEREG_MR (or an invalidation, or a new
//! fast registration) has run, no remote access touches the MR's pages, not even a READ
//! response or WRITE packets that were already on the wire when the key was checked. The
//! same for a sender's buffer once its WR is flushed: a SEND on the wire then never carries
//! what the consumer wrote there after.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

/// Holds every packet one port sends (for `ns` of fabric time) while `on`; packets after
/// the first `pass` go through the hold.
struct Hold {
    lid: u16,
    ns: u64,
    pass: std::sync::atomic::AtomicU32,
    on: AtomicBool,
}

impl LinkHook for Hold {
    fn on_packet(&self, link: LinkId, _now: u64, _pkt: &mut Packet) -> Verdict {
        if !self.on.load(Relaxed) || link.dir != LinkDir::Up || link.lid != self.lid {
            return Verdict::Pass;
        }
        let left = self.pass.load(Relaxed);
        if left > 0 {
            self.pass.store(left - 1, Relaxed);
            return Verdict::Pass;
        }
        Verdict::Delay(self.ns)
    }
}

fn hold(lid: u16, pass: u32) -> Arc<Hold> {
    Arc::new(Hold {
        lid,
        ns: 1_000_000,
        pass: pass.into(),
        on: true.into(),
    })
}

/// Runs the fabric's clock until `d` has a completion on `cq` (retry timeouts included).
fn completion(fabric: &Fabric, d: &mut Driver, cq: &mut CqH) -> HcaCqe {
    for _ in 0..50 {
        fabric.advance(Duration::from_millis(20));
        if let Some(c) = d.drain_cq(cq).into_iter().next() {
            return c;
        }
    }
    panic!("no completion");
}

fn dereg(d: &mut Driver, key: u32) {
    let h = HcaCmdHandle {
        handle: key,
        rsvd: 0,
    };
    assert_eq!(d.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
}

#[test]
fn test_a_read_response_on_the_wire_when_its_mr_goes_is_never_copied() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, DEFAULT_RTS);
    let secret = p.b.alloc(4096, 4096);
    p.b.write(secret, &pattern(4096, 7));
    let mr = p.b.reg_mr(
        p.pd_b,
        secret,
        4096,
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ,
    );
    let dst = p.a.alloc(4096, 4096);
    // B's responses wait on its uplink.
    let h = hold(p.b.lid(), 0);
    fabric.set_hook(Some(h.clone()));
    let w = HcaSendWqe {
        wr_id: 1,
        opcode: WR_RDMA_READ as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: secret,
        rkey: mr,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, w, &[sge(dst, 4096, p.key_a)]);
    assert!(p.a.drain_cq(&mut p.cq_a).is_empty(), "the response is held");
    // B takes the MR back while its response is on the wire.
    dereg(&mut p.b, mr);
    h.on.store(false, Relaxed);
    let c = completion(&fabric, &mut p.a, &mut p.cq_a);
    assert_eq!(
        u32::from(c.status),
        WC_REM_ACCESS_ERR,
        "asked again, refused"
    );
    assert_eq!(
        p.a.read(dst, 4096),
        vec![0; 4096],
        "no byte of the MR arrived"
    );
    assert!(p.a.hca.stats().revoked >= 1);
}

#[test]
fn test_write_packets_behind_a_dereg_do_not_land() {
    let fabric = Fabric::with_manual_clock();
    // MTU 1024: a 16 KiB WRITE is sixteen packets; the first passes, the rest are held.
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, DEFAULT_RTS);
    let target = p.b.alloc(16384, 4096);
    let mr = p.b.reg_mr(
        p.pd_b,
        target,
        16384,
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
    );
    let src = p.a.alloc(16384, 4096);
    p.a.write(src, &pattern(16384, 3));
    let h = hold(p.a.lid(), 1);
    fabric.set_hook(Some(h.clone()));
    let w = HcaSendWqe {
        wr_id: 2,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: target,
        rkey: mr,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, w, &[sge(src, 16384, p.key_a)]);
    assert_eq!(
        p.b.read(target, 1024),
        pattern(16384, 3)[..1024].to_vec(),
        "the first packet landed"
    );
    dereg(&mut p.b, mr);
    h.on.store(false, Relaxed);
    let c = completion(&fabric, &mut p.a, &mut p.cq_a);
    assert_eq!(u32::from(c.status), WC_REM_ACCESS_ERR);
    assert_eq!(
        p.b.read(target + 1024, 16384 - 1024),
        vec![0; 16384 - 1024],
        "nothing after the dereg"
    );
    assert!(p.b.hca.stats().revoked >= 1);
}

#[test]
fn test_a_send_on_the_wire_when_its_qp_fails_never_carries_the_reused_buffer() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, DEFAULT_RTS);
    let src = p.a.alloc(4096, 4096);
    p.a.write(src, &pattern(4096, 5));
    let dst = p.b.alloc(4096, 4096);
    p.b.post_recv(&mut p.qb, 9, &[sge(dst, 4096, p.key_b)]);
    // A's SEND waits on its uplink.
    let h = hold(p.a.lid(), 0);
    fabric.set_hook(Some(h.clone()));
    let w = HcaSendWqe {
        wr_id: 1,
        opcode: WR_SEND as u8,
        flags: WQE_SIGNALED as u8,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, w, &[sge(src, 4096, p.key_a)]);
    // A's QP fails while the SEND is on the wire: the WR completes flushed, and its buffer
    // is A's consumer's again, who fills it with something else.
    p.a.to_error(p.qa.qpn);
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(c.len(), 1);
    assert_eq!(u32::from(c[0].status), WC_WR_FLUSH_ERR);
    p.a.write(src, &pattern(4096, 6));
    h.on.store(false, Relaxed);
    for _ in 0..10 {
        fabric.advance(Duration::from_millis(20));
    }
    // What B may see is the SEND as it was posted, or nothing: never the later bytes.
    let got = p.b.read(dst, 4096);
    assert!(
        got == vec![0; 4096] || got == pattern(4096, 5),
        "B received bytes A wrote after its WR completed"
    );
    assert_ne!(
        p.b.qp_state(p.qb.qpn),
        QPS_ERR,
        "B's QP is not A's to break"
    );
}
