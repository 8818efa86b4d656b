//! The KVM backend on this host's /dev/kvm, with the bare-metal test guest (no Linux): it
//! enumerates PCI, finds the HCA, reads BAR2's signature, rings the command doorbell (an
//! ioeventfd) and takes the MSI-X interrupt (an irqfd through a GSI route). Skips, saying
//! why, where there is no /dev/kvm or the guest could not be built.

use std::time::{Duration, Instant};

use hca_model::Fabric;
use hcabench::kvm::machine::{Machine, MachineConfig};
use hcabench::kvm::{check_kvm, TEST_GUEST, TEST_GUEST_ENTRY, TEST_GUEST_STACK};

fn kvm_or_skip(test: &str) -> Option<kvm_ioctls::Kvm> {
    if TEST_GUEST.is_empty() {
        eprintln!("SKIP {test}: the bare-metal test guest was not built (no gcc at build time)");
        return None;
    }
    match kvm_ioctls::Kvm::new() {
        Ok(k) => Some(k),
        Err(e) => {
            eprintln!("SKIP {test}: no usable /dev/kvm ({e})");
            None
        }
    }
}

#[test]
fn test_kvm_check_answers_quickly() {
    let t = Instant::now();
    let verdict = check_kvm();
    eprintln!("check_kvm: {verdict:?} in {:.1?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5), "{verdict:?}");
}

#[test]
fn test_baremetal_guest_finds_the_hca_and_gets_its_msix_interrupt() {
    let Some(kvm) = kvm_or_skip("baremetal") else {
        return;
    };
    let fabric = Fabric::new();
    let mut m = Machine::new(
        &kvm,
        MachineConfig {
            name: "vm1".into(),
            ram_bytes: 16 << 20,
            serial_log: None,
        },
        &fabric,
    )
    .unwrap();
    m.load_flat(TEST_GUEST, TEST_GUEST_ENTRY, TEST_GUEST_STACK)
        .unwrap();
    let out = m.run(Duration::from_secs(120)).unwrap();
    eprintln!("{}", out.serial);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.serial.contains("HCATEST PASS"), "{}", out.serial);
    assert!(
        out.serial.contains("bar2-signature 0x0000000042414348"),
        "{}",
        out.serial
    );
    assert!(m.hca().stats().interrupts >= 1, "{:?}", m.hca().stats());
    assert!(m.hca().stats().commands >= 1, "{:?}", m.hca().stats());
}
