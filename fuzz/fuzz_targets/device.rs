//! A hostile guest (A) drives its HCA with any sequence of WQEs, raw ring bytes, producer
//! indices, doorbells, BAR2 writes and commands, while the fabric's clock moves and a link
//! hook drops, duplicates and delays packets. The device never panics, and the victim (B)
//! sees no byte change outside the window it opened to A and its own CQ rings.
#![no_main]

use hcabench_fuzz_harness::device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: device::Input| device::run(input));
