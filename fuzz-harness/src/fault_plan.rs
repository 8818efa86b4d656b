//! The fault-plan parser fed any text, and the plans it accepts run against a stream of
//! packets and adapter events: never a panic, whatever a plan file or a campaign script
//! says.

use arbitrary::Arbitrary;
use hca_model::adapter_hook::AdapterHook;
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::packet::{Packet, Payload, RC_SEND_ONLY};
use hca_model::{LinkDir, LinkHook, LinkId};

#[derive(Arbitrary, Debug)]
pub enum Event {
    Packet {
        lid: u8,
        up: bool,
        dt_us: u16,
        len: u8,
    },
    Doorbell {
        lid: u8,
        class: u8,
        dt_us: u16,
    },
    Interrupt {
        lid: u8,
        vector: u8,
        dt_us: u16,
    },
    SendWqe {
        lid: u8,
        qpn: u16,
        dt_us: u16,
    },
    Cqe {
        lid: u8,
        cqn: u8,
        dt_us: u16,
    },
}

#[derive(Arbitrary, Debug)]
pub struct Input<'a> {
    /// A plan built from fragments that the parser knows, or any text.
    known: Vec<u8>,
    text: &'a str,
    events: Vec<Event>,
}

const FRAGMENTS: [&str; 24] = [
    "seed = 7\n",
    "[[link]]\n",
    "[[node]]\n",
    "[[adapter]]\n",
    "lid = 2\n",
    "lid = 0\n",
    "dir = \"up\"\n",
    "dir = \"both\"\n",
    "drop = 0.5\n",
    "duplicate = 0.3\n",
    "reorder = 0.2\n",
    "corrupt = 0.1\n",
    "delay_us = 200\n",
    "jitter_us = 100\n",
    "down = [[0, 100]]\n",
    "down = [[100, 0]]\n",
    "kill_ms = 1\n",
    "error_wqe = 1\n",
    "lose_doorbell = 1.0\n",
    "lose_interrupt = 0.5\n",
    "late_interrupt = 1.0\nlate_interrupt_us = 10\n",
    "cq_overflow_after = 0\n",
    "qpn = 2\n",
    "cqn = 1\n",
];

/// One run of the target on a decoded input.
pub fn run(input: Input<'_>) {
    let mut text: String = input
        .known
        .iter()
        .take(40)
        .map(|&k| FRAGMENTS[usize::from(k) % FRAGMENTS.len()])
        .collect();
    if input.known.is_empty() {
        text = input.text.to_string();
    }
    let Ok(plan) = FaultPlan::parse(&text) else {
        return;
    };
    let hook = FaultHook::new(plan, None);
    hook.set_origin(0);
    let mut now = 0u64;
    for e in input.events.iter().take(500) {
        match *e {
            Event::Packet {
                lid,
                up,
                dt_us,
                len,
            } => {
                now += u64::from(dt_us) * 1000;
                let mut pkt = Packet {
                    slid: 1,
                    dlid: u16::from(lid),
                    opcode: RC_SEND_ONLY,
                    payload: Payload::Bytes(vec![0x5a; usize::from(len)]),
                    ..Default::default()
                };
                let dir = if up { LinkDir::Up } else { LinkDir::Down };
                let _ = hook.on_packet(
                    LinkId {
                        lid: u16::from(lid),
                        dir,
                    },
                    now,
                    &mut pkt,
                );
                let _ = hook.link_up(u16::from(lid), now);
            }
            Event::Doorbell { lid, class, dt_us } => {
                now += u64::from(dt_us) * 1000;
                let _ = hook.doorbell(u16::from(lid), u32::from(class), now);
            }
            Event::Interrupt { lid, vector, dt_us } => {
                now += u64::from(dt_us) * 1000;
                let _ = hook.interrupt(u16::from(lid), u32::from(vector), now);
            }
            Event::SendWqe { lid, qpn, dt_us } => {
                now += u64::from(dt_us) * 1000;
                let _ = hook.send_wqe(u16::from(lid), u32::from(qpn), now);
            }
            Event::Cqe { lid, cqn, dt_us } => {
                now += u64::from(dt_us) * 1000;
                let _ = hook.cqe(u16::from(lid), u32::from(cqn), now);
            }
        }
    }
}
