//! A hostile guest (A) drives its HCA with any sequence of WQEs, raw ring bytes, producer
//! indices, doorbells, BAR2 writes and commands (the actions of `hca_test_driver::hostile`,
//! which the model's property tests draw too), while the fabric's clock moves and a link
//! hook drops, duplicates and delays packets (or, with no hook, bursts go through whole). The device never panics, and the victim (B)
//! sees no byte change outside the window it opened to A and its own CQ rings.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkHook, LinkId, Verdict};
use hca_test_driver::hostile::{Action, Target};
use hca_test_driver::*;

use crate::common;

/// One step: the guest's (A's), or the fabric's.
#[derive(Arbitrary, Debug)]
pub enum Step {
    Guest(Action),
    Advance {
        ms: u8,
    },
    /// The hook's next verdicts (two bits each: pass, drop, duplicate, delay); 0 (pass
    /// everything) takes the hook off, so that the fabric delivers bursts as such (one ACK
    /// per burst, see `PacketSink::deliver_in_burst`).
    Verdicts(u64),
}

/// Drops, duplicates and delays by the bits it was given last.
struct Chaos(AtomicU64);

impl LinkHook for Chaos {
    fn on_packet(&self, _: LinkId, _: u64, _: &mut Packet) -> Verdict {
        let v = self.0.load(Relaxed);
        self.0.store(v.rotate_right(2), Relaxed);
        match v & 3 {
            0 => Verdict::Pass,
            1 => Verdict::Drop,
            2 => Verdict::Duplicate,
            _ => Verdict::Delay(200_000),
        }
    }
}

/// What the fuzzer decodes its bytes into.
pub type Input = Vec<Step>;

/// One run of the target on a decoded input.
pub fn run(steps: Input) {
    drive(steps);
}

/// Like [`run`]; the fingerprint of the state the run ends in (see [`common::fingerprint`]).
pub fn run_fingerprint(steps: Input) -> u64 {
    common::fingerprint(&drive(steps))
}

fn drive(steps: Input) -> Pair {
    let fabric = Fabric::with_manual_clock();
    let chaos = Arc::new(Chaos(AtomicU64::new(0)));
    let mut p = common::pair(fabric.clone(), 3);
    let win = common::Window::open(&mut p, |_, _| {});
    let target = Target {
        window: win.addr,
        key: win.key,
    };
    for step in steps.iter().take(64) {
        match step {
            Step::Guest(a) => a.apply(&mut p, target),
            Step::Advance { ms } => fabric.advance(Duration::from_millis(u64::from(*ms))),
            Step::Verdicts(v) => {
                chaos.0.store(*v, Relaxed);
                let hook: Arc<dyn LinkHook> = chaos.clone();
                fabric.set_hook((*v != 0).then_some(hook));
            }
        }
    }
    fabric.set_hook(None);
    fabric.advance(Duration::from_secs(1));
    win.check(&p);
    p
}
