//! The fault-plan parser fed any text, and the plans it accepts run against a stream of
//! packets and adapter events: never a panic, whatever a plan file or a campaign script
//! says.
#![no_main]

use hcabench_fuzz_harness::fault_plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: fault_plan::Input| fault_plan::run(input));
