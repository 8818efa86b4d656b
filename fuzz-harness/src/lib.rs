//! The fuzz targets' bodies, one module per target: each has an `Input` (what libFuzzer's
//! bytes decode into, through `arbitrary`) and `run`, which drives the model with it and
//! asserts what must hold for any input (no panic, no byte of the victim changed outside
//! what it opened, bounds kept). `fuzz/` wraps each in a cargo-fuzz binary (nightly);
//! `tests/corpus.rs` replays the committed corpora (`fuzz/corpus/TARGET/`) on stable, so
//! CI runs every target on every input the fuzzer kept.

pub mod cluster_config;
pub mod common;
pub mod device;
pub mod fault_plan;
pub mod pci;
pub mod remote;
pub mod responder;
pub mod sa;

use arbitrary::{Arbitrary, Unstructured};

/// Decodes `bytes` the way libfuzzer-sys does for a typed target and runs `run` on the
/// result; bytes that decode to nothing are skipped, as the fuzzer skips them. Whether it
/// ran.
pub fn replay<'a, T: Arbitrary<'a>>(bytes: &'a [u8], run: impl FnOnce(T)) -> bool {
    match T::arbitrary_take_rest(Unstructured::new(bytes)) {
        Ok(input) => {
            run(input);
            true
        }
        Err(_) => false,
    }
}
