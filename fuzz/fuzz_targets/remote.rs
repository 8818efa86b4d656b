//! Datagrams from peer hosts into a host of a three-host subnet: never a panic, and what
//! the host sends on stays bounded by what it was sent.
#![no_main]

use hcabench_fuzz_harness::remote;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: remote::Input| remote::run(input));
