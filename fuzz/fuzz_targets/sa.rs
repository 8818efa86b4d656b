//! The subnet administrator fed any sequence of MADs (and port changes): it never panics,
//! every answer is one MAD for the asker's QP, and what it keeps stays within its bounds.
#![no_main]

use hcabench_fuzz_harness::sa;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: sa::Input| sa::run(input));
