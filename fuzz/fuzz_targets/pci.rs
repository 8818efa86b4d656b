//! The VMM's PCI configuration mechanism and MSI-X table fed any port and MMIO accesses a
//! guest can make (any width, string I/O included): never a panic, and a BAR reads back
//! only what its size allows.
#![no_main]

use hcabench_fuzz_harness::pci;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: pci::Input| pci::run(input));
