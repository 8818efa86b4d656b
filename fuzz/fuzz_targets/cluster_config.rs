//! The cluster file's parser fed any text: never a panic, and what it accepts is written
//! and read back unchanged.
#![no_main]

use hcabench_fuzz_harness::cluster_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: cluster_config::Input| cluster_config::run(input));
