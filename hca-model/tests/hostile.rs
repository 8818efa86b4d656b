//! Property tests with hostile guests: random doorbells, random WQE and command bytes,
//! random keys and addresses. The device must not panic, must not touch any memory a peer
//! did not open to it, and must keep serving everyone else.

use hca_model::abi::*;
use hca_model::Fabric;
use hca_test_driver::hostile::{Action, Pick, Target};
use hca_test_driver::*;
use proptest::prelude::*;

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        Just(Pick::Real),
        (0u32..0x3000).prop_map(Pick::RealPlus),
        any::<u64>().prop_map(Pick::Any),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (prop_oneof![Just(2u8), Just(3), Just(4), Just(5), Just(6), 0u8..9],
              prop_oneof![Just(WQE_SIGNALED as u8), any::<u8>()], pick(), pick(), pick(),
              0u32..600, prop::collection::vec((pick(), 0u32..10_000, pick()), 0..4),
              prop::option::weighted(0.2, any::<u8>()))
            .prop_map(|(opcode, flags, remote, rkey, imm, inline_len, sges, raw_num_sge)| {
                Action::Wqe { opcode, flags, remote, rkey, imm, inline_len, sges, raw_num_sge }
            }),
        1 => prop::collection::vec(any::<u8>(), 64..=512).prop_map(Action::RawWqe),
        1 => (any::<bool>(), prop_oneof![0u32..80, any::<u32>()])
            .prop_map(|(recv, value)| Action::ProducerIndex { recv, value }),
        1 => any::<u32>().prop_map(Action::Doorbell),
        1 => ((0u32..BAR2_SIZE / 4).prop_map(|w| w * 4), any::<u32>())
            .prop_map(|(offset, value)| Action::Bar2Write { offset, value }),
        2 => (prop_oneof![0u32..0x58, any::<u32>()], prop::collection::vec(any::<u8>(), 0..96))
            .prop_map(|(opcode, input)| Action::Command { opcode, input }),
    ]
}

/// Victim B opens `WINDOW` bytes at `window` to A (remote read/write/atomic); everything
/// else of B's memory is off limits, except what B's own HCA legitimately writes there (its
/// CQ rings).
const WINDOW: u64 = 0x4000;

struct World {
    p: Pair,
    window: u64,
    window_key: u32,
    c: Driver,
    cq_bc: CqH,
    qbc: QpH,
    qcb: QpH,
    cq_c: CqH,
    key_c: u32,
}

fn world() -> World {
    world_on(Fabric::with_manual_clock())
}

fn world_on(fabric: Fabric) -> World {
    let mut p = Pair::build(fabric, 3, ALL_ACCESS, DEFAULT_RTS);
    let window = p.b.alloc(WINDOW, 4096);
    let window_key = p.b.reg_mr(p.pd_b, window, WINDOW, ALL_ACCESS);
    // The window is all B opens: drop the pair's all-memory DMA MR, use the local DMA lkey.
    let (st, _) = p.b.cmd(
        CMD_DEREG_MR,
        &HcaCmdHandle {
            handle: p.key_b,
            rsvd: 0,
        },
    );
    assert_eq!(st, CMD_OK);
    p.key_b = LOCAL_DMA_LKEY;
    // Receives for A's SENDs land inside the window too.
    for i in 0..8 {
        p.b.post_recv(&mut p.qb, i, &[sge(window + 512 * i, 512, p.key_b)]);
    }
    let mut c = Driver::new(Some(&p.fabric), 4);
    let pd_c = c.alloc_pd();
    let key_c = c.reg_dma_mr(pd_c, ALL_ACCESS);
    let cq_c = c.create_cq(6);
    let qcb = c.create_qp(QPT_RC, pd_c, cq_c.cqn, cq_c.cqn);
    let cq_bc = p.b.create_cq(6);
    let qbc = p.b.create_qp(QPT_RC, p.pd_b, cq_bc.cqn, cq_bc.cqn);
    let (lb, lc) = (p.b.lid(), c.lid());
    c.bring_up_rc(qcb.qpn, lb, qbc.qpn, ALL_ACCESS, 5);
    p.b.bring_up_rc(qbc.qpn, lc, qcb.qpn, ALL_ACCESS, 5);
    World {
        p,
        window,
        window_key,
        c,
        cq_bc,
        qbc,
        qcb,
        cq_c,
        key_c,
    }
}

fn qp_state(d: &mut Driver, qpn: u32) -> Option<u32> {
    let (st, out) = d.cmd(
        CMD_QUERY_QP,
        &HcaCmdHandle {
            handle: qpn,
            rsvd: 0,
        },
    );
    (st == CMD_OK).then(|| u32::from(decode::<HcaQpAttr>(&out).state))
}

/// Keeps the attack surface alive: once either QP of the A-B connection has left RTS (as
/// the first bad WQE makes it do), both are reset and reconnected and B's receives
/// re-posted, so that every later action reaches B's responder again.
fn recover(w: &mut World) {
    let p = &mut w.p;
    let (Some(sa), Some(sb)) = (qp_state(&mut p.a, p.qa.qpn), qp_state(&mut p.b, p.qb.qpn)) else {
        return; // The attacker destroyed its own QP.
    };
    if sa == QPS_RTS && sb == QPS_RTS {
        return;
    }
    for (d, q) in [(&mut p.a, &mut p.qa), (&mut p.b, &mut p.qb)] {
        d.modify_qp(q.qpn, QP_ATTR_STATE, HcaQpAttr::default());
        q.sq_pi = 0;
        q.rq_pi = 0;
    }
    let (la, lb) = (p.a.lid(), p.b.lid());
    let access = ALL_ACCESS;
    p.a.bring_up_rc(p.qa.qpn, lb, p.qb.qpn, access, 3);
    p.b.bring_up_rc(p.qb.qpn, la, p.qa.qpn, access, 3);
    for i in 0..8 {
        let key = p.key_b;
        p.b.post_recv(&mut p.qb, i, &[sge(w.window + 512 * i, 512, key)]);
    }
}

fn attack(w: &mut World, a: &Action) {
    let target = Target {
        window: w.window,
        key: w.window_key,
    };
    a.apply(&mut w.p, target);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn test_hostile_guest_cannot_touch_peer_memory_outside_its_window(
        actions in prop::collection::vec(action(), 1..40)
    ) {
        let mut w = world();
        let size = 8 * MIB as usize;
        let before = w.p.b.read(0, size);
        for a in &actions {
            attack(&mut w, a);
            recover(&mut w);
        }
        let after = w.p.b.read(0, size);
        let window = w.window as usize..(w.window + WINDOW) as usize;
        let own_cq = |c: &CqH| c.ring as usize..(c.ring + (32 << c.log)) as usize;
        let (cq1, cq2) = (own_cq(&w.p.cq_b), own_cq(&w.cq_bc));
        for (i, (x, y)) in before.iter().zip(&after).enumerate() {
            if x != y {
                prop_assert!(
                    window.contains(&i) || cq1.contains(&i) || cq2.contains(&i),
                    "victim byte {i:#x} changed outside what it opened"
                );
            }
        }

        // The victim still serves its other peer, both ways.
        let (src_c, dst_b) = (w.c.alloc(64, 8), w.p.b.alloc(64, 8));
        w.c.write(src_c, &pattern(64, 1));
        let kb = w.p.key_b;
        w.p.b.post_recv(&mut w.qbc, 1, &[sge(dst_b, 64, kb)]);
        let kc = w.key_c;
        w.c.post_send(&mut w.qcb, send_wr(1, WR_SEND, WQE_SIGNALED), &[sge(src_c, 64, kc)]);
        let done = w.c.drain_cq(&mut w.cq_c);
        prop_assert_eq!(done.len(), 1);
        prop_assert_eq!(u32::from(done[0].status), WC_SUCCESS);
        prop_assert_eq!(w.p.b.read(dst_b, 64), pattern(64, 1));
        prop_assert_eq!(w.p.b.drain_cq(&mut w.cq_bc).len(), 1);

        // And the attacker's own device still answers commands.
        let (st, _) = w.p.a.cmd_raw(CMD_QUERY_DEVICE, &[], 0);
        prop_assert_eq!(st, CMD_OK);
    }

    #[test]
    fn test_random_mailbox_bytes_always_complete_with_a_status(
        cmds in prop::collection::vec((any::<u32>(), prop::collection::vec(any::<u8>(), 96)), 1..30)
    ) {
        let fabric = Fabric::with_manual_clock();
        let mut a = Driver::new(Some(&fabric), 4);
        for (opcode, input) in &cmds {
            // Known opcodes more often than chance.
            let op = if opcode % 3 == 0 { opcode % 0x50 } else { *opcode };
            let (st, _) = a.cmd_raw(op, input, *opcode & CMD_FLAG_EVENT);
            prop_assert!(st <= CMD_BAD_ADDRESS, "status {st} is not in the ABI");
        }
    }

    #[test]
    fn test_random_doorbells_and_bar2_writes_never_panic(
        writes in prop::collection::vec((0u32..BAR2_SIZE, any::<u32>(), any::<u32>()), 1..200)
    ) {
        let mut p = Pair::new(5);
        let buf = p.a.alloc(64, 8);
        let key = p.key_a;
        for (off, val, db) in &writes {
            p.a.hca.bar2().store_u32(off & !3, *val);
            p.a.hca.doorbell(*db);
        }
        // Posting still works or fails cleanly; the device answers either way.
        p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, WQE_SIGNALED), &[sge(buf, 8, key)]);
        let (st, _) = p.a.cmd_raw(CMD_QUERY_PORT, &[], 0);
        prop_assert_eq!(st, CMD_OK);
    }
}

#[test]
fn test_hostile_guests_on_threads_of_their_own_leave_a_victim_pair_working() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    // Two attackers (each with its victim B and third node C, as above) and a victim pair,
    // all on one fabric; each attacker on its own thread, the victim pair on another: the
    // fabric's queues are used from three threads at once.
    let fabric = Fabric::with_manual_clock();
    let mut attackers: Vec<World> = (0..2).map(|_| world_on(fabric.clone())).collect();
    let mut victim = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let mut runner = TestRunner::deterministic();
    let plans: Vec<Vec<Action>> = (0..2)
        .map(|_| {
            prop::collection::vec(action(), 150)
                .new_tree(&mut runner)
                .unwrap()
                .current()
        })
        .collect();
    let size = 8 * MIB as usize;
    let before: Vec<Vec<u8>> = attackers.iter().map(|w| w.p.b.read(0, size)).collect();
    std::thread::scope(|s| {
        for (w, plan) in attackers.iter_mut().zip(&plans) {
            s.spawn(move || {
                for a in plan {
                    attack(w, a);
                    recover(w);
                }
            });
        }
        s.spawn(|| victim.sends_in_order(100));
    });
    for (w, before) in attackers.iter().zip(&before) {
        let after = w.p.b.read(0, size);
        let window = w.window as usize..(w.window + WINDOW) as usize;
        let own_cq = |c: &CqH| c.ring as usize..(c.ring + (32 << c.log)) as usize;
        let (cq1, cq2) = (own_cq(&w.p.cq_b), own_cq(&w.cq_bc));
        for (i, (x, y)) in before.iter().zip(&after).enumerate() {
            assert!(
                x == y || window.contains(&i) || cq1.contains(&i) || cq2.contains(&i),
                "attacked byte {i:#x} changed outside what its owner opened"
            );
        }
    }
    assert_eq!(fabric.backlog(), 0, "nothing left queued");
}
