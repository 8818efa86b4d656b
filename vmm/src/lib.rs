//! The KVM backend: virtual machines on kvm-ioctls with the HCA model in the same process.
//!
//! One [`machine::Machine`] is one VM: guest RAM (a memfd through vm-memory), the in-kernel
//! irqchip, a PCI host bridge on configuration mechanism 1 with the HCA behind it
//! ([`hca_pci`]: doorbells through ioeventfds, MSI-X through GSI routes and irqfds, BAR2 as a
//! memory slot), two 16550 serial ports (vm-superio: COM1 the console, to a log; COM2 the
//! shell job's command channel), read-only virtio block devices on virtio-mmio (the guests'
//! shared userland disk), and a thread per vCPU. Several machines in one process attach
//! their HCAs to one [`hca_model::fabric::Fabric`]. With the `vfio` feature a host PCI
//! function can join a machine's bus beside the HCA (`vfio`).
//!
//! # Modules
//!
//! - [`machine`]: one VM, its vCPU threads and their exits.
//! - [`boot`]: RAM, memory slots, long mode; [`linux`]: the kernel through linux-loader;
//!   [`mptable`]: the MP table; [`cpuid`]: the hypervisor bit, TSC deadline, KVM's signature.
//! - [`pci`]: the bus and `ConfigSpace`, every emulated function's configuration space;
//!   [`hca_pci`]: the HCA on it.
//! - [`irq`]: the shared GSI routing table and the MSI-X table.
//! - [`serial`]: the 16550s (the console to a log and a socket; COM2, the shell job's command
//!   channel); [`rtc`]: the CMOS clock.
//! - [`virtio_mmio`]: the virtio-mmio transport; [`virtio_blk`]: the read-only block device
//!   behind it (the userland disk).
//! - `vfio` and `vfio_config` (feature `vfio`): a host PCI function passed through.
//! - [`test_guest`]: the bare-metal test guest (`guest/`, C and assembly built by
//!   `build.rs`), which `tests/kvm.rs` runs.

// Guest exits (port and MMIO accesses, PCI configuration, MSI-X) never panic the VMM:
// indexing, unwrap and expect that could are refused by the compiler.
#![cfg_attr(
    not(test),
    warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)
)]

pub mod boot;
pub mod cpuid;
pub mod hca_pci;
pub mod irq;
pub mod linux;
pub mod machine;
pub mod mptable;
pub mod pci;
pub mod rtc;
pub mod serial;
pub mod test_guest;
#[cfg(feature = "vfio")]
pub mod vfio;
pub mod vfio_config;
pub mod virtio_blk;
pub mod virtio_mmio;
pub mod virtio_net;

pub use test_guest::{TEST_GUEST, TEST_GUEST_ENTRY, TEST_GUEST_STACK};

use std::time::{Duration, Instant};

/// Whether this host's KVM can run a full guest, and why not when it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmCheck {
    Usable,
    Unusable(String),
}

/// Decides quickly (never hangs): /dev/kvm must open, the CPU must advertise hardware
/// virtualisation (vmx/svm), and a one-instruction guest must run at native speed. A KVM
/// that emulates instruction by instruction (seen on hosts without vmx/svm passed through)
/// cannot run Linux, so it counts as unusable here.
pub fn check_kvm() -> KvmCheck {
    let kvm = match kvm_ioctls::Kvm::new() {
        Ok(k) => k,
        Err(e) => return KvmCheck::Unusable(format!("/dev/kvm: {e}")),
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !hw {
        return KvmCheck::Unusable(no_hw_virt(std::path::Path::new("/sys/module")));
    }
    match spin_test(&kvm, Duration::from_millis(100)) {
        Ok(()) => KvmCheck::Usable,
        Err(e) => KvmCheck::Unusable(e.to_string()),
    }
}

/// Why a KVM without vmx/svm cannot run Linux. The build machines' /dev/kvm, and the
/// accelerator machines', is PVM (the `kvm_pvm` module: KVM without hardware
/// virtualisation), which runs only guest kernels built for it: Debian's kernel dies there
/// of an emulation failure.
fn no_hw_virt(modules: &std::path::Path) -> String {
    if modules.join("kvm_pvm").exists() {
        "the CPU shows no vmx/svm flag and /dev/kvm here is PVM (module kvm_pvm), which runs \
         only guest kernels built for PVM, not Debian's"
            .into()
    } else {
        "the CPU shows no vmx/svm flag: /dev/kvm here cannot run a Linux guest at native \
         speed"
            .into()
    }
}

/// Why the spin test's guest did not run, or ran too slowly.
#[derive(Debug, thiserror::Error)]
enum SpinError {
    /// A VM or vCPU ioctl (named) failed.
    #[error("{0}: {1}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("guest memory: {0}")]
    Ram(#[source] boot::BootError),
    #[error("memory slot: {0}")]
    Slot(#[source] boot::BootError),
    #[error("{0}")]
    Write(#[from] vm_memory::GuestMemoryError),
    #[error("test guest exited with {0}")]
    Exit(String),
    #[error("a 100000-iteration loop took {0:.1?} under KVM: emulated, not accelerated")]
    Slow(Duration),
}

/// Runs a real-mode loop of 100000 iterations (well under a millisecond on hardware
/// virtualisation, about half a second when emulated); too slow means emulated.
fn spin_test(kvm: &kvm_ioctls::Kvm, limit: Duration) -> Result<(), SpinError> {
    use vm_memory::{Bytes, GuestAddress};
    // mov ecx, 100000; loop $; hlt
    let code: [u8; 9] = [0x66, 0xb9, 0xa0, 0x86, 0x01, 0x00, 0xe2, 0xfe, 0xf4];
    let kvm_err = |what| move |e| SpinError::Kvm(what, e);
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem = boot::guest_ram(0x10000).map_err(SpinError::Ram)?;
    boot::map_ram(&vm, &mem).map_err(SpinError::Slot)?;
    mem.write_slice(&code, GuestAddress(0))?;
    let vcpu = vm.create_vcpu(0).map_err(kvm_err("vcpu"))?;
    let mut sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    regs.rip = 0;
    regs.rflags = 2;
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))?;
    let t = Instant::now();
    let mut vcpu = vcpu;
    loop {
        match vcpu.run() {
            Ok(kvm_ioctls::VcpuExit::Hlt) => break,
            Ok(other) => return Err(SpinError::Exit(format!("{other:?}"))),
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(SpinError::Kvm("KVM_RUN", e)),
        }
    }
    let took = t.elapsed();
    if took > limit {
        return Err(SpinError::Slow(took));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_kvm_without_vmx_or_svm_is_named_pvm_when_kvm_pvm_is_loaded() {
        let dir = std::env::temp_dir().join(format!("vmm-modules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!no_hw_virt(&dir).contains("PVM"), "{}", no_hw_virt(&dir));
        std::fs::create_dir_all(dir.join("kvm_pvm")).unwrap();
        let why = no_hw_virt(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(why.contains("PVM (module kvm_pvm)"), "{why}");
    }
}
