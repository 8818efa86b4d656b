//! The responder fed raw packets, as a hostile peer (or a spoofing node) could put them on
//! the wire: any opcode, PSN, QPN, RETH, AtomicETH, AETH, ImmDt, IETH and payload, one
//! packet at a time (trains are the model's own, never a peer's). The device never panics,
//! and the victim's memory changes only inside the window it opened and its own CQ rings.
#![no_main]

use hcabench_fuzz_harness::responder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: responder::Input| responder::run(input));
