//! Catastrophic errors (`hcabench fault NODE fatal`) and the function reset a driver
//! recovers with: the dead adapter flushes what its consumers posted so that their teardown
//! finishes, refuses new work, drops what the fabric brings it; RESET brings it back empty,
//! its port up, and keys from before the reset match nothing after it. A reset underneath
//! the driver (`hcabench fault NODE reset`) forgets everything at once, flushes nothing,
//! and holds the function until the driver's own reset.

use std::time::Duration;

use hca_model::abi::*;
use hca_test_driver::*;
use vm_memory::ByteValued;

const MS: Duration = Duration::from_millis(1);

/// A's completions, advancing the fabric's manual clock a millisecond at a time, until `n`
/// arrived or `max` of fabric time passed.
fn completions_of_a(p: &mut Pair, n: usize, max: Duration) -> Vec<HcaCqe> {
    let mut got = Vec::new();
    let mut waited = Duration::ZERO;
    loop {
        got.extend(p.a.drain_cq(&mut p.cq_a));
        if got.len() >= n || waited >= max {
            return got;
        }
        p.fabric.advance(MS);
        waited += MS;
    }
}

fn info(d: &Driver) -> HcaDevInfo {
    d.hca.bar2().read_obj(BAR2_INFO_OFFSET)
}

/// The opcodes a healthy device accepts and a dead one refuses with CMD_FATAL.
fn create_cq_status(d: &mut Driver) -> u32 {
    match d.try_create_cq(6, VEC_COMP_FIRST) {
        Ok(_) => CMD_OK,
        Err(st) => st,
    }
}

#[test]
fn test_a_dead_adapter_flushes_refuses_new_work_and_tears_down() {
    let mut p = Pair::new(MTU_4096 as u8);
    assert_ne!(
        info(&p.b).caps & CAP_RESET,
        0,
        "the device says it has CAP_RESET"
    );
    // Work posted on B before it dies: two receives and a send it cannot have sent yet
    // (the QP's send queue is rung only after the error).
    let buf = p.b.alloc(4096, 64);
    p.b.post_recv(&mut p.qb, 11, &[sge(buf, 4096, p.key_b)]);
    p.b.post_recv(&mut p.qb, 12, &[sge(buf, 4096, p.key_b)]);
    p.b.drain_eq(VEC_ASYNC);

    assert!(p.b.hca.inject_catastrophic());
    assert!(
        !p.b.hca.inject_catastrophic(),
        "a second error changes nothing"
    );
    assert_eq!(p.b.hca.catastrophic_syndrome(), CATAS_INJECTED);
    let i = info(&p.b);
    assert_eq!(
        (i.catas_syndrome, u32::from(i.port_state)),
        (CATAS_INJECTED, PORT_DOWN)
    );
    let events: Vec<(u32, u32)> = (p.b.drain_eq(VEC_ASYNC).iter())
        .map(|e| (u32::from(e.event_type), e.param))
        .collect();
    assert!(events.contains(&(EV_PORT_DOWN, 1)), "{events:?}");
    assert!(events.contains(&(EV_CATAS, CATAS_INJECTED)), "{events:?}");
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR, "the QP went to ERR");
    let flushed = p.b.drain_statuses(&mut p.cq_b);
    assert_eq!(flushed, vec![(11, WC_WR_FLUSH_ERR), (12, WC_WR_FLUSH_ERR)]);

    // A send posted now (ib_drain_qp's marker) completes flushed: teardown can wait for it.
    let w = send_wr(13, WR_SEND, WQE_SIGNALED);
    p.b.post_send(&mut p.qb, w, &[sge(buf, 64, p.key_b)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(13, WC_WR_FLUSH_ERR)]);

    // New work is refused; what tears down runs.
    assert_eq!(create_cq_status(&mut p.b), CMD_FATAL);
    assert_eq!(p.b.alloc_mw(p.pd_b, MW_TYPE_1), Err(CMD_FATAL));
    let mut back = HcaQpAttr {
        state: QPS_RTS as u8,
        ..Default::default()
    };
    assert_eq!(p.b.modify_qp(p.qb.qpn, QP_ATTR_STATE, back), CMD_FATAL);
    back.state = QPS_RESET as u8;
    assert_eq!(p.b.modify_qp(p.qb.qpn, QP_ATTR_STATE, back), CMD_OK);
    let qpn = p.qb.qpn;
    assert_eq!(p.b.cmd(CMD_DESTROY_QP, &handle(qpn)).0, CMD_OK);
    assert_eq!(p.b.cmd(CMD_DESTROY_CQ, &handle(p.cq_b.cqn)).0, CMD_OK);
    assert_eq!(p.b.cmd(CMD_DEREG_MR, &handle(p.key_b)).0, CMD_OK);
    assert_eq!(p.b.cmd(CMD_DEALLOC_PD, &handle(p.pd_b)).0, CMD_OK);
}

/// A writes 4 KiB into B, whose adapter no longer answers: A's WRITE runs out of retries
/// and B's memory is untouched.
fn write_to_b_goes_unanswered(p: &mut Pair, seed: u8) {
    let (src, dst) = (p.a.alloc(4096, 64), p.b.alloc(4096, 64));
    p.a.write(src, &pattern(4096, seed));
    let mut w = send_wr(21, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    p.a.post_send(&mut p.qa, w, &[sge(src, 4096, p.key_a)]);
    // timeout 14 (67 ms) x 8 tries.
    let c = completions_of_a(p, 1, Duration::from_secs(5));
    assert_eq!(c.len(), 1, "A's WRITE completes");
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (21, WC_RETRY_EXC_ERR));
    assert_eq!(
        p.b.read(dst, 4096),
        vec![0; 4096],
        "the dead adapter wrote nothing"
    );
}

#[test]
fn test_a_dead_adapter_drops_what_peers_send_and_their_rc_retries_run_out() {
    let mut p = Pair::new(MTU_4096 as u8);
    p.b.hca.inject_catastrophic();
    write_to_b_goes_unanswered(&mut p, 5);
}

#[test]
fn test_reset_brings_the_adapter_back_empty_and_old_keys_match_nothing() {
    let mut p = Pair::new(MTU_4096 as u8);
    let old_key = p.key_b;
    let old_qpn = p.qb.qpn;
    p.b.hca.inject_catastrophic();
    // The driver resets polled (flags 0), as the ABI says.
    let (st, _) = p.b.cmd_raw(CMD_RESET, &[], 0);
    assert_eq!(st, CMD_OK);
    let i = info(&p.b);
    assert_eq!((i.signature, i.catas_syndrome), (SIGNATURE, 0));
    assert_eq!(u32::from(i.port_state), PORT_ACTIVE, "the port is back");
    assert_eq!(i.lid, p.b.lid());
    assert_eq!(i.caps & CAP_RESET, CAP_RESET);
    assert_eq!(p.b.hca.catastrophic_syndrome(), 0);

    // A new driver instance, as a reprobe makes: nothing of the old one is left.
    let mut b = Driver::with_port(p.b.hca.clone(), p.b.mem.clone());
    assert_eq!(b.drain_eq(VEC_ASYNC).len(), 0, "the EQs start empty");
    assert_eq!(b.cmd(CMD_QUERY_QP, &handle(old_qpn)).0, CMD_BAD_HANDLE);
    assert_eq!(b.cmd(CMD_DEREG_MR, &handle(old_key)).0, CMD_BAD_HANDLE);

    // It sets up again and A reaches it; A's old key for B's memory does not.
    let pd = b.alloc_pd();
    let key = b.reg_dma_mr(pd, ALL_ACCESS);
    assert_ne!(key, old_key, "a new tag on the reused slot");
    let cq = b.create_cq(6);
    let qb = b.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    // QPNs go on after the old ones: a peer's CM may still hold a connection to one.
    assert!(
        qb.qpn > old_qpn,
        "QPN {} after the reset, {old_qpn} before",
        qb.qpn
    );
    let mut qa = p.a.create_qp(QPT_RC, p.pd_a, p.cq_a.cqn, p.cq_a.cqn);
    p.a.bring_up_rc(qa.qpn, b.lid(), qb.qpn, ALL_ACCESS, MTU_4096 as u8);
    b.bring_up_rc(qb.qpn, p.a.lid(), qa.qpn, ALL_ACCESS, MTU_4096 as u8);
    let (src, dst) = (p.a.alloc(8192, 64), b.alloc(8192, 64));
    p.a.write(src, &pattern(8192, 9));
    for (wr_id, rkey, want) in [(31, key, WC_SUCCESS), (32, old_key, WC_REM_ACCESS_ERR)] {
        let mut w = send_wr(wr_id, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, rkey);
        p.a.post_send(&mut qa, w, &[sge(src, 8192, p.key_a)]);
        let c = completions_of_a(&mut p, 1, Duration::from_secs(1));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].wr_id, u32::from(c[0].status)), (wr_id, want));
    }
    assert_eq!(b.read(dst, 8192), pattern(8192, 9));
}

/// A fresh device in the slot of one that went (a replug) hands out QPNs from where the
/// last one got to, as a reset device does; past the table's end they wrap round.
#[test]
fn test_a_device_continues_the_qpns_of_the_one_before_it() {
    let p = Pair::new(MTU_4096 as u8);
    let next = p.b.hca.next_qpn();
    assert!(next > p.qb.qpn, "next {next}, last handed out {}", p.qb.qpn);
    let mut d = Driver::new(None, 4);
    d.hca.continue_qpns_from(next);
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    assert_eq!(d.create_qp(QPT_RC, pd, cq.cqn, cq.cqn).qpn, next);
    d.hca.continue_qpns_from(MAX_QP + 5);
    assert_eq!(d.hca.next_qpn(), 2 + (MAX_QP + 5 - 2) % (MAX_QP - 2));
}

#[test]
fn test_reset_on_a_healthy_adapter_drops_its_state_too() {
    let mut p = Pair::new(MTU_4096 as u8);
    let qpn = p.qb.qpn;
    assert_eq!(p.b.cmd_raw(CMD_RESET, &[], 0).0, CMD_OK);
    let mut b = Driver::with_port(p.b.hca.clone(), p.b.mem.clone());
    assert_eq!(b.cmd(CMD_QUERY_QP, &handle(qpn)).0, CMD_BAD_HANDLE);
    assert_eq!(create_cq_status(&mut b), CMD_OK);
}

#[test]
fn test_a_reset_underneath_forgets_everything_flushes_nothing_and_waits_for_the_driver() {
    let mut p = Pair::new(MTU_4096 as u8);
    let (qpn, cqn) = (p.qb.qpn, p.cq_b.cqn);
    let buf = p.b.alloc(4096, 64);
    p.b.post_recv(&mut p.qb, 11, &[sge(buf, 4096, p.key_b)]);
    p.b.drain_eq(VEC_ASYNC);

    assert!(p.b.hca.inject_reset());
    assert!(!p.b.hca.inject_reset(), "it was held in the reset already");
    let i = info(&p.b);
    assert_eq!(
        (i.catas_syndrome, u32::from(i.port_state)),
        (CATAS_RESET, PORT_DOWN)
    );
    assert_eq!(p.b.drain_eq(VEC_ASYNC).len(), 0, "no EQ is left to say so");
    assert_eq!(
        p.b.drain_statuses(&mut p.cq_b),
        vec![],
        "nothing is flushed"
    );
    // A send rung now reaches no QP: it neither runs nor completes.
    let w = send_wr(13, WR_SEND, WQE_SIGNALED);
    p.b.post_send(&mut p.qb, w, &[sge(buf, 64, p.key_b)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![]);

    // Until the driver resets it, what it made is unknown and new work is refused; a
    // command completes in the mailbox alone: no EQ is the driver's.
    let (st, _) =
        p.b.cmd_raw(CMD_DESTROY_CQ, handle(cqn).as_slice(), CMD_FLAG_EVENT);
    assert_eq!(st, CMD_BAD_HANDLE);
    for v in 0..NUM_VECTORS {
        // The reset zeroed BAR2, EQ rings included: the first slot of each stays so.
        let first: HcaEqe =
            p.b.hca
                .bar2()
                .read_obj(BAR2_EQ_OFFSET + v * EQ_ENTRIES * 16);
        assert_eq!(first.event_type, 0, "an event on EQ {v}");
    }
    assert_eq!(p.b.cmd(CMD_DESTROY_QP, &handle(qpn)).0, CMD_BAD_HANDLE);
    assert_eq!(p.b.cmd(CMD_DESTROY_CQ, &handle(cqn)).0, CMD_BAD_HANDLE);
    assert_eq!(create_cq_status(&mut p.b), CMD_FATAL);

    // Its peer's RC gets no answer, and nothing is written.
    write_to_b_goes_unanswered(&mut p, 7);

    // The driver's reset brings it back, as after a catastrophic error.
    assert_eq!(p.b.cmd_raw(CMD_RESET, &[], 0).0, CMD_OK);
    let i = info(&p.b);
    assert_eq!(
        (i.catas_syndrome, u32::from(i.port_state)),
        (0, PORT_ACTIVE)
    );
    let mut b = Driver::with_port(p.b.hca.clone(), p.b.mem.clone());
    assert_eq!(create_cq_status(&mut b), CMD_OK);
}

fn handle(v: u32) -> HcaCmdHandle {
    HcaCmdHandle { handle: v, rsvd: 0 }
}
