//! The CPUID each vCPU shows its guest: what KVM_GET_SUPPORTED_CPUID reports, plus what KVM
//! leaves to the VMM.
//!
//! - The hypervisor bit (leaf 1, ECX bit 31). Linux reads the paravirtual leaves at
//!   0x4000_0000 only when it is set; without it the guest takes itself for bare metal, gets
//!   no kvm-clock, calibrates the TSC against the PIT (which fails when the host is busy:
//!   "Unable to calibrate against PIT", TSC marked unstable, jiffies as the clocksource) and
//!   calibrates the LAPIC timer the same way. That was the early-boot stall under nested KVM.
//! - TSC-deadline mode of the LAPIC timer (leaf 1, ECX bit 24). KVM emulates it whenever
//!   KVM_CAP_TSC_DEADLINE_TIMER is there but never reports it as supported; with it Linux
//!   arms the timer in TSC ticks and needs no LAPIC timer calibration.
//! - The KVM signature leaf ("KVMKVMKVM", the highest paravirtual leaf in EAX), added if the
//!   host's KVM did not list it, so that kvm-clock and the other features in 0x4000_0001
//!   are found.
//! - Each vCPU's own APIC ID (leaf 1 EBX bits 31:24; the x2APIC ID in leaves 0xb and 0x1f), to
//!   match the MP table.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

const LEAF_FEATURES: u32 = 1;
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;
/// The paravirtual leaves' base: the hypervisor's signature.
pub const LEAF_KVM_SIGNATURE: u32 = 0x4000_0000;
/// KVM's paravirtual feature bits (kvm-clock, PV EOI, ...).
pub const LEAF_KVM_FEATURES: u32 = 0x4000_0001;
pub const ECX_TSC_DEADLINE: u32 = 1 << 24;
pub const ECX_HYPERVISOR: u32 = 1 << 31;
/// "KVMKVMKVM\0\0\0" in EBX, ECX, EDX.
pub const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

/// Why a vCPU's CPUID could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CpuidError {
    #[error("CPUID table full: {0:?}")]
    Full(#[source] vmm_sys_util::fam::Error),
}

/// The CPUID for the vCPU with local APIC ID `apic_id`, from the host KVM's `supported`
/// table; `tsc_deadline` says whether KVM emulates the TSC-deadline timer
/// (KVM_CAP_TSC_DEADLINE_TIMER).
pub fn for_vcpu(supported: &CpuId, apic_id: u8, tsc_deadline: bool) -> Result<CpuId, CpuidError> {
    let mut cpuid = supported.clone();
    let mut signature = false;
    for e in cpuid.as_mut_slice() {
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x00ff_ffff) | u32::from(apic_id) << 24;
                e.ecx |= ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= ECX_TSC_DEADLINE;
                }
            }
            LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => e.edx = u32::from(apic_id),
            LEAF_KVM_SIGNATURE => {
                signature = true;
                e.eax = e.eax.max(LEAF_KVM_FEATURES);
                [e.ebx, e.ecx, e.edx] = KVM_SIGNATURE;
            }
            _ => {}
        }
    }
    if !signature {
        cpuid
            .push(kvm_cpuid_entry2 {
                function: LEAF_KVM_SIGNATURE,
                eax: LEAF_KVM_FEATURES,
                ebx: KVM_SIGNATURE[0],
                ecx: KVM_SIGNATURE[1],
                edx: KVM_SIGNATURE[2],
                ..Default::default()
            })
            .map_err(CpuidError::Full)?;
    }
    Ok(cpuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    fn find(c: &CpuId, function: u32) -> kvm_cpuid_entry2 {
        *c.as_slice()
            .iter()
            .find(|e| e.function == function)
            .unwrap_or_else(|| panic!("no leaf {function:#x}"))
    }

    /// What KVM_GET_SUPPORTED_CPUID returns, in shape: no hypervisor or TSC-deadline bit,
    /// APIC ID 0, optionally the signature leaf.
    fn supported(with_signature: bool) -> CpuId {
        let mut v = vec![
            entry(0, 0, [0xd, 0, 0, 0]),
            entry(1, 0, [0x00a2_0f12, 0x0001_0800, 0x7ed8_3203, 0x178b_fbff]),
            entry(0xb, 0, [0, 1, 0x100, 0]),
            entry(0xb, 1, [0, 1, 0x201, 0]),
            entry(LEAF_KVM_FEATURES, 0, [0x0100_7afb, 0, 0, 0]),
        ];
        if with_signature {
            v.push(entry(LEAF_KVM_SIGNATURE, 0, [0x4000_0001, 0, 0, 0]));
        }
        CpuId::from_entries(&v).unwrap()
    }

    #[test]
    fn test_hypervisor_bit_lets_linux_find_the_kvm_leaves() {
        let c = for_vcpu(&supported(true), 0, false).unwrap();
        assert_ne!(find(&c, 1).ecx & ECX_HYPERVISOR, 0);
        let sig = find(&c, LEAF_KVM_SIGNATURE);
        assert_eq!([sig.ebx, sig.ecx, sig.edx], KVM_SIGNATURE);
        let bytes: Vec<u8> = [sig.ebx, sig.ecx, sig.edx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        assert_eq!(&bytes[..9], b"KVMKVMKVM");
        assert!(sig.eax >= LEAF_KVM_FEATURES);
        // kvm-clock and the other PV features pass through as KVM reported them.
        assert_eq!(find(&c, LEAF_KVM_FEATURES).eax, 0x0100_7afb);
        // The rest of leaf 1 is KVM's.
        assert_eq!(find(&c, 1).edx, 0x178b_fbff);
        assert_eq!(find(&c, 1).ecx & !ECX_HYPERVISOR, 0x7ed8_3203);
    }

    #[test]
    fn test_missing_signature_leaf_is_added() {
        let c = for_vcpu(&supported(false), 0, false).unwrap();
        let sig = find(&c, LEAF_KVM_SIGNATURE);
        assert_eq!(sig.eax, LEAF_KVM_FEATURES);
        assert_eq!([sig.ebx, sig.ecx, sig.edx], KVM_SIGNATURE);
        assert_eq!(c.as_slice().len(), supported(false).as_slice().len() + 1);
    }

    #[test]
    fn test_tsc_deadline_only_where_kvm_emulates_it() {
        let with = for_vcpu(&supported(true), 0, true).unwrap();
        assert_ne!(find(&with, 1).ecx & ECX_TSC_DEADLINE, 0);
        let without = for_vcpu(&supported(true), 0, false).unwrap();
        assert_eq!(find(&without, 1).ecx & ECX_TSC_DEADLINE, 0);
    }

    #[test]
    fn test_each_vcpu_sees_its_own_apic_id() {
        let c = for_vcpu(&supported(true), 3, true).unwrap();
        assert_eq!(find(&c, 1).ebx >> 24, 3);
        assert_eq!(find(&c, 1).ebx & 0x00ff_ffff, 0x0001_0800);
        for e in c.as_slice().iter().filter(|e| e.function == 0xb) {
            assert_eq!(e.edx, 3, "leaf 0xb subleaf {}", e.index);
        }
    }
}
