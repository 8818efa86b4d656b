//! Fault plans acting on the HCAs themselves (an error completion on the Nth WQE, lost
//! doorbells, lost and late interrupts, CQ overflow) and on whole nodes (a planned kill, live
//! link-down/up and kill), in virtual time.

use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::faults::{AdapterEvent, FaultHook, FaultPlan, LiveFault};
use hca_model::reliability::ack_timeout_ns;
use hca_model::{AdapterFault, Fabric, HcaStats};
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);

/// A pair on a manual clock with `plan` on its links and HCAs (QP timeout 8 = ~1 ms,
/// retry_cnt 3).
fn pair_with(plan: &str) -> (Pair, Arc<FaultHook>) {
    let fabric = Fabric::with_manual_clock();
    let p = Pair::build(fabric.clone(), 3, ALL_ACCESS, (8, 3, 7));
    let hook = Arc::new(FaultHook::new(FaultPlan::parse(plan).unwrap(), None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    fabric.set_adapter_hook(Some(hook.clone()));
    (p, hook)
}

/// Posts a signaled 64-byte RDMA Write from A to B.
fn write(p: &mut Pair, wr_id: u64) {
    let src = p.a.alloc(64, 64);
    let dst = p.b.alloc(64, 64);
    let mut w = send_wr(wr_id, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
}

fn statuses(p: &mut Pair) -> Vec<(u64, u32)> {
    p.a.drain_statuses(&mut p.cq_a)
}

#[test]
fn test_the_nth_wqe_of_a_qp_completes_in_error_and_the_rest_flush() {
    let (mut p, hook) = pair_with("seed = 1\n[[adapter]]\nlid = 1\nerror_wqe = 3\n");
    for id in 1..=5 {
        write(&mut p, id);
    }
    let got = statuses(&mut p);
    assert_eq!(
        got,
        [
            (1, WC_SUCCESS),
            (2, WC_SUCCESS),
            (3, WC_GENERAL_ERR),
            (4, WC_WR_FLUSH_ERR),
            (5, WC_WR_FLUSH_ERR)
        ]
    );
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
    assert_eq!(hook.counts().wqe_errors, 1);
}

#[test]
fn test_a_forced_cq_overflow_raises_the_cq_error_event() {
    let (mut p, hook) = pair_with("[[adapter]]\nlid = 1\ncq_overflow_after = 2\n");
    for id in 1..=3 {
        write(&mut p, id);
    }
    assert_eq!(
        statuses(&mut p).len(),
        2,
        "the third CQE is lost to the overflow"
    );
    let ev = p.a.drain_eq(VEC_ASYNC);
    assert!(
        ev.iter().any(|e| u32::from(e.event_type) == EV_CQ_ERR
            && e.param == p.cq_a.cqn
            && e.data == ERR_CQ_OVERFLOW),
        "{ev:?}"
    );
    assert_eq!(hook.counts().cq_overflows, 1);
    assert!(p.a.hca.stats().cqes_lost >= 1);
}

#[test]
fn test_a_lost_doorbell_leaves_the_wqe_until_the_next_one() {
    let (mut p, hook) = pair_with("[[adapter]]\nlid = 1\nlose_doorbell = 1.0\n");
    write(&mut p, 1);
    assert!(statuses(&mut p).is_empty(), "the doorbell was lost");
    assert_eq!(hook.counts().doorbells_lost, 1);
    p.fabric.set_adapter_hook(None);
    write(&mut p, 2);
    assert_eq!(statuses(&mut p), [(1, WC_SUCCESS), (2, WC_SUCCESS)]);
}

#[test]
fn test_a_hook_attached_after_its_ports_sees_their_receive_doorbells() {
    // A receive doorbell with nothing to do (no QP in ERR) takes no turn of the device
    // lock, unless a hook is there to see it: one attached to a fabric whose ports are up.
    let (mut p, hook) = pair_with("[[adapter]]\nlid = 2\nlose_doorbell = 1.0\n");
    let buf = p.b.alloc(8, 8);
    let rung = p.b.hca.stats().doorbells;
    p.b.post_recv(&mut p.qb, 1, &[sge(buf, 8, p.key_b)]);
    assert_eq!(hook.counts().doorbells_lost, 1);
    assert_eq!(
        p.b.hca.stats().doorbells,
        rung,
        "a lost doorbell is not rung"
    );
    p.fabric.set_adapter_hook(None);
    p.b.post_recv(&mut p.qb, 2, &[sge(buf, 8, p.key_b)]);
    assert_eq!(
        p.b.hca.stats().doorbells,
        rung + 1,
        "one with nothing to do is still counted"
    );
    // Both receives are there for the next messages.
    let src = p.a.alloc(8, 8);
    for id in [1, 2] {
        p.a.post_send(&mut p.qa, send_wr(id, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    }
    assert_eq!(
        p.b.drain_statuses(&mut p.cq_b),
        [(1, WC_SUCCESS), (2, WC_SUCCESS)]
    );
}

#[test]
fn test_interrupts_can_be_lost_or_late() {
    let (mut p, hook) = pair_with("[[adapter]]\nlid = 1\nlose_interrupt = 1.0\n");
    let irqs = |p: &Pair| p.a.irq.get(VEC_COMP_FIRST);
    p.a.arm_cq(&mut p.cq_a, false);
    write(&mut p, 1);
    assert_eq!(irqs(&p), 0, "the completion interrupt was lost");
    assert_eq!(statuses(&mut p).len(), 1, "the CQE is there all the same");
    assert_eq!(hook.counts().interrupts_lost, 1);

    let plan = "[[adapter]]\nlid = 1\nlate_interrupt = 1.0\nlate_interrupt_us = 2500\n";
    let (mut p, hook) = pair_with(plan);
    p.a.arm_cq(&mut p.cq_a, false);
    write(&mut p, 1);
    assert_eq!(irqs(&p), 0, "not yet");
    p.fabric.advance(2 * MS);
    assert_eq!(irqs(&p), 0, "2 ms: still not");
    p.fabric.advance(MS);
    assert_eq!(irqs(&p), 1, "3 ms: raised");
    assert_eq!(hook.counts().interrupts_late, 1);
}

/// Advances until A's CQ holds a CQE or `limit` passes.
fn wait_cqe(p: &mut Pair, limit: Duration) -> Option<(u64, u32)> {
    let start = p.fabric.now_ns();
    while p.fabric.now_ns() - start < limit.as_nanos() as u64 {
        if let Some(c) = statuses(p).first() {
            return Some(*c);
        }
        p.fabric.advance(MS);
    }
    None
}

#[test]
fn test_a_planned_node_kill_gives_its_peer_retry_exceeded() {
    let (mut p, hook) = pair_with("[[node]]\nlid = 2\nkill_ms = 5\n");
    write(&mut p, 1);
    assert_eq!(statuses(&mut p), [(1, WC_SUCCESS)]);
    p.fabric.advance(4 * MS);
    assert!(hook.due_kills(p.fabric.now_ns()).is_empty());
    p.fabric.advance(MS);
    assert_eq!(hook.due_kills(p.fabric.now_ns()), [2]);
    assert!(
        hook.due_kills(p.fabric.now_ns()).is_empty(),
        "each kill once"
    );
    write(&mut p, 2);
    // 4 tries of ~1 ms each, each seen at a 1 ms tick.
    let bound = Duration::from_nanos(4 * (ack_timeout_ns(8).unwrap() + 1_000_000));
    assert_eq!(wait_cqe(&mut p, bound), Some((2, WC_RETRY_EXC_ERR)));
    let c = hook.counts();
    assert_eq!(c.nodes_killed, 1);
    assert!(c.node_dead >= 4, "{c:?}");
}

#[test]
fn test_planned_adapter_faults_come_due_once_in_order_and_are_checked() {
    let (mut p, hook) = pair_with(
        "[[adapter]]\nlid = 2\nreset_ms = 9\nfatal_ms = 5\nreplug_ms = 60001\nunplug_ms = 60000\n",
    );
    write(&mut p, 1);
    assert_eq!(statuses(&mut p), [(1, WC_SUCCESS)]);
    p.fabric.advance(4 * MS);
    assert!(hook.due_adapter_events(p.fabric.now_ns()).is_empty());
    p.fabric.advance(MS);
    let fatal = hook.due_adapter_events(p.fabric.now_ns());
    assert_eq!(fatal, [(2, AdapterEvent::Fault(AdapterFault::Fatal))]);
    assert!(
        hook.due_adapter_events(p.fabric.now_ns()).is_empty(),
        "once"
    );
    assert_eq!(hook.counts().adapters_fatal, 1);
    // The caller gives it (as hcabench's daemon does): node2's peer then gets no answer.
    assert_eq!(p.fabric.adapter_fault(2, AdapterFault::Fatal), Some(true));
    write(&mut p, 2);
    let bound = Duration::from_nanos(4 * (ack_timeout_ns(8).unwrap() + 1_000_000));
    assert_eq!(wait_cqe(&mut p, bound), Some((2, WC_RETRY_EXC_ERR)));
    p.fabric.advance(4 * MS);
    let reset = hook.due_adapter_events(p.fabric.now_ns());
    assert_eq!(reset, [(2, AdapterEvent::Fault(AdapterFault::Reset))]);
    assert_eq!(hook.counts().adapters_reset, 1);
    assert_eq!(p.fabric.adapter_fault(2, AdapterFault::Reset), Some(false));
    assert_eq!(p.b.hca.catastrophic_syndrome(), CATAS_RESET);
    // Unplug and replug come due in their order, for the caller to make happen.
    p.fabric.advance(60_001 * MS);
    let hotplug = hook.due_adapter_events(p.fabric.now_ns());
    assert_eq!(
        hotplug,
        [(2, AdapterEvent::Unplug), (2, AdapterEvent::Replug)]
    );
    assert_eq!(hook.counts().adapters_unplugged, 1);
    for (bad, field) in [
        ("[[adapter]]\nfatal_ms = 5\n", "fatal_ms"),
        ("[[adapter]]\nlid = 0\nfatal_ms = 5\n", "fatal_ms"),
        ("[[adapter]]\nlid = 2\nfatal_ms = -1\n", "fatal_ms"),
        ("[[adapter]]\nreset_ms = 5\n", "reset_ms"),
        ("[[adapter]]\nlid = 2\nreset_ms = nan\n", "reset_ms"),
        ("[[adapter]]\nunplug_ms = 5\n", "unplug_ms"),
        ("[[adapter]]\nlid = 2\nreplug_ms = 5\n", "replug_ms"),
        (
            "[[adapter]]\nlid = 2\nunplug_ms = 5\nreplug_ms = 5\n",
            "earlier unplug_ms",
        ),
    ] {
        let e = FaultPlan::parse(bad).unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

#[test]
fn test_live_link_down_stalls_and_link_up_resumes() {
    // retry_cnt 7 with timeout 8: about 16 ms of budget.
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, (8, 7, 7));
    let hook = Arc::new(FaultHook::new(FaultPlan::default(), None));
    fabric.set_hook(Some(hook.clone()));
    hook.live(2, LiveFault::LinkDown, fabric.now_ns());
    write(&mut p, 1);
    assert_eq!(
        wait_cqe(&mut p, 5 * MS),
        None,
        "stalled while the link is down"
    );
    hook.live(2, LiveFault::LinkUp, fabric.now_ns());
    assert_eq!(wait_cqe(&mut p, 5 * MS), Some((1, WC_SUCCESS)));
    let st: HcaStats = p.a.hca.stats();
    assert!(st.retransmits > 0);
    assert!(hook.counts().link_down > 0);

    hook.live(2, LiveFault::Kill, fabric.now_ns());
    write(&mut p, 2);
    assert_eq!(wait_cqe(&mut p, 40 * MS), Some((2, WC_RETRY_EXC_ERR)));
    assert_eq!(hook.due_kills(fabric.now_ns()), [2]);
}

/// The port state of `d`'s HCA, as QUERY_PORT and BAR2 say it.
fn port_state(d: &mut Driver) -> u32 {
    let port: HcaPortAttr = decode(&d.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    let info: HcaDevInfo = d.hca.bar2().read_obj(BAR2_INFO_OFFSET);
    assert_eq!(u32::from(port.state), u32::from(info.port_state));
    u32::from(port.state)
}

fn port_events(d: &mut Driver) -> Vec<u32> {
    d.drain_eq(VEC_ASYNC)
        .iter()
        .map(|e| u32::from(e.event_type))
        .filter(|&t| t == EV_PORT_DOWN || t == EV_PORT_ACTIVE)
        .collect()
}

#[test]
fn test_the_port_goes_down_with_its_link_and_comes_back_with_it() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let mut b = Driver::new(Some(&fabric), 4);
    port_events(&mut a);
    port_events(&mut b);
    let plan = FaultPlan::parse("[[link]]\nlid = 2\ndown = [[10.0, 20.0]]\n").unwrap();
    let hook = Arc::new(FaultHook::new(plan, None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    fabric.advance(5 * MS);
    assert_eq!(port_state(&mut b), PORT_ACTIVE, "before the window");
    fabric.advance(10 * MS);
    assert_eq!(port_state(&mut b), PORT_DOWN, "in the down window");
    assert_eq!(port_events(&mut b), [EV_PORT_DOWN]);
    assert_eq!(
        port_state(&mut a),
        PORT_ACTIVE,
        "the other port is not touched"
    );
    assert!(port_events(&mut a).is_empty());
    fabric.advance(10 * MS);
    assert_eq!(port_state(&mut b), PORT_ACTIVE, "after the window");
    assert_eq!(port_events(&mut b), [EV_PORT_ACTIVE]);
    // Live, as `hcabench fault node1 link-down` does it.
    hook.live(1, LiveFault::LinkDown, fabric.now_ns());
    fabric.advance(MS);
    assert_eq!(
        (port_state(&mut a), port_events(&mut a)),
        (PORT_DOWN, vec![EV_PORT_DOWN])
    );
    hook.live(1, LiveFault::LinkUp, fabric.now_ns());
    fabric.advance(MS);
    assert_eq!(
        (port_state(&mut a), port_events(&mut a)),
        (PORT_ACTIVE, vec![EV_PORT_ACTIVE])
    );
    // Taking the plan off brings a downed link back.
    hook.live(1, LiveFault::LinkDown, fabric.now_ns());
    fabric.advance(MS);
    fabric.set_hook(None);
    fabric.advance(MS);
    assert_eq!(port_state(&mut a), PORT_ACTIVE);
}
