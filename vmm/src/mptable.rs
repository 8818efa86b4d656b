//! The Intel MultiProcessor Specification 1.4 table: how a Linux guest without ACPI finds its
//! CPUs (one processor entry per vCPU, local APIC IDs 0..n), the I/O APIC and the routing
//! of the ISA interrupts (IRQ i -> I/O APIC pin i, as KVM's default GSI routes have it).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The floating pointer and the table sit in the last KiB of base memory (639K), one of the
/// places Linux scans; the e820 map reserves it.
pub const MPTABLE_START: u64 = 0x9_fc00;
pub const MAX_VCPUS: u8 = 32;

const LAPIC_ADDR: u32 = 0xfee0_0000;
const IOAPIC_ADDR: u32 = 0xfec0_0000;
const ISA_BUS: u8 = 0;
const ISA_IRQS: u8 = 16;

fn checksum(b: &[u8]) -> u8 {
    0u8.wrapping_sub(b.iter().fold(0u8, |s, x| s.wrapping_add(*x)))
}

fn processor(id: u8) -> [u8; 20] {
    let mut e = [0u8; 20];
    e[0] = 0; // processor entry
    e[1] = id; // local APIC ID
    e[2] = 0x14; // local APIC version
    e[3] = 1 | if id == 0 { 2 } else { 0 }; // enabled, bootstrap processor
    e[4..8].copy_from_slice(&0x600u32.to_le_bytes()); // family 6 signature
    e[8..12].copy_from_slice(&0x201u32.to_le_bytes()); // FPU, APIC
    e
}

/// Why the MP table could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("{0} vCPUs: between 1 and {MAX_VCPUS} are supported")]
    Vcpus(u8),
    #[error("MP table does not fit below 640K")]
    TooBig,
    #[error("MP table: {0}")]
    Write(#[from] vm_memory::GuestMemoryError),
}

/// An 8-byte I/O (type 3) or local (type 4) interrupt assignment entry.
fn interrupt(kind: u8, irq_type: u8, src_irq: u8, dst: u8, pin: u8) -> [u8; 8] {
    [kind, irq_type, 0, 0, ISA_BUS, src_irq, dst, pin]
}

/// Writes the table for `vcpus` processors; the I/O APIC takes the ID after the last CPU.
pub fn write(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), MpTableError> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(MpTableError::Vcpus(vcpus));
    }
    let ioapic_id = vcpus;
    let mut entries: Vec<u8> = Vec::new();
    for id in 0..vcpus {
        entries.extend_from_slice(&processor(id));
    }
    entries.extend_from_slice(&[1, ISA_BUS, b'I', b'S', b'A', b' ', b' ', b' ']);
    let mut ioapic = [2, ioapic_id, 0x11, 1, 0, 0, 0, 0];
    ioapic[4..].copy_from_slice(&IOAPIC_ADDR.to_le_bytes());
    entries.extend_from_slice(&ioapic);
    for irq in 0..ISA_IRQS {
        entries.extend_from_slice(&interrupt(3, 0, irq, ioapic_id, irq)); // INT
    }
    entries.extend_from_slice(&interrupt(4, 3, 0, 0xff, 0)); // ExtINT -> LINT0
    entries.extend_from_slice(&interrupt(4, 1, 0, 0xff, 1)); // NMI -> LINT1
    let count = u16::from(vcpus) + 1 + 1 + u16::from(ISA_IRQS) + 2;

    let table_addr = MPTABLE_START + 16;
    let mut table = Vec::with_capacity(44 + entries.len());
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&((44 + entries.len()) as u16).to_le_bytes());
    table.push(4); // specification 1.4
    table.push(0); // checksum, below
    table.extend_from_slice(b"HCABENCH");
    table.extend_from_slice(b"KVM-VMM     ");
    table.extend_from_slice(&[0; 6]); // no OEM table
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&LAPIC_ADDR.to_le_bytes());
    table.extend_from_slice(&[0; 4]); // no extended table
    table.extend_from_slice(&entries);
    let sum = checksum(&table);
    if let Some(b) = table.get_mut(7) {
        *b = sum;
    }

    let mut fp = [0u8; 16];
    fp[..4].copy_from_slice(b"_MP_");
    fp[4..8].copy_from_slice(&(table_addr as u32).to_le_bytes());
    fp[8] = 1; // length in 16-byte units
    fp[9] = 4;
    fp[10] = checksum(&fp);
    if table_addr + table.len() as u64 > 0xa_0000 {
        return Err(MpTableError::TooBig);
    }
    mem.write_slice(&fp, GuestAddress(MPTABLE_START))?;
    mem.write_slice(&table, GuestAddress(table_addr))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mptable_checksums_and_counts() {
        let mem = crate::boot::guest_ram(1 << 20).unwrap();
        write(&mem, 4).unwrap();
        let mut fp = [0u8; 16];
        mem.read_slice(&mut fp, GuestAddress(MPTABLE_START))
            .unwrap();
        assert_eq!(&fp[..4], b"_MP_");
        assert_eq!(fp.iter().fold(0u8, |s, x| s.wrapping_add(*x)), 0);
        let len: u16 = mem.read_obj(GuestAddress(MPTABLE_START + 16 + 4)).unwrap();
        let mut t = vec![0u8; len as usize];
        mem.read_slice(&mut t, GuestAddress(MPTABLE_START + 16))
            .unwrap();
        assert_eq!(&t[..4], b"PCMP");
        assert_eq!(t.iter().fold(0u8, |s, x| s.wrapping_add(*x)), 0);
        let count = u16::from_le_bytes([t[34], t[35]]);
        assert_eq!(count, 4 + 2 + 16 + 2);
        assert_eq!(len as usize, 44 + 4 * 20 + 20 * 8);
        assert!(write(&mem, 0).is_err() && write(&mem, MAX_VCPUS + 1).is_err());
    }
}
