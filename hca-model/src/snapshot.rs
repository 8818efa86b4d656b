//! A UC message's bytes, copied as it is sent.
//!
//! An RC message's payload stays a gather list in the sender's memory until the receiver
//! copies it, because the WR completes only at its ACK and the buffer is not the consumer's
//! before then. A UC WR completes as it is sent, with no ACK to wait for, so its bytes must
//! be taken then, as a NIC's DMA reads them onto the wire. The copy lives in an anonymous
//! mapping of its own, reached through [`DmaSpace`] as guest memory is (so packets cut it
//! into MTU pieces and receivers scatter it without another copy), and is charged to the
//! device's in-flight bytes until the last packet holding it is taken or dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryMmap, VolatileSlice};

use crate::dma::{DmaFault, DmaSpace, GuestRam, RamTable, Slices};
use crate::packet::{Payload, Seg, SegList};

/// The host page the copy's mapping is made of: what it costs, rounded.
const PAGE: usize = 4096;

/// The copy, charged to a device's in-flight bytes while it lives.
pub(crate) struct Snapshot {
    ram: GuestRam<GuestMemoryMmap<()>>,
    charge: usize,
    held: Arc<AtomicUsize>,
}

impl Snapshot {
    /// `payload` with its bytes copied now, if they are a reference into guest memory (a
    /// payload carried inline already is a copy); the copy is charged to `held`. A fault
    /// (the bytes cannot be read, or no memory can be mapped) copies nothing.
    pub(crate) fn take(payload: Payload, held: &Arc<AtomicUsize>) -> Result<Payload, DmaFault> {
        let len = payload.len();
        if !matches!(payload, Payload::Dma(_)) || len == 0 {
            return Ok(payload);
        }
        let fault = DmaFault {
            addr: 0,
            len: len.into(),
        };
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len as usize)])
            .map_err(|_| fault)?;
        let ram = GuestRam::new(mem);
        let whole = Seg { addr: 0, len };
        payload.scatter(&ram, &[whole])?;
        let charge = (len as usize).next_multiple_of(PAGE);
        held.fetch_add(charge, Ordering::Relaxed);
        let copy: Arc<dyn DmaSpace> = Arc::new(Snapshot {
            ram,
            charge,
            held: held.clone(),
        });
        Ok(Payload::dma(copy, SegList::from_elem(whole, 1), None))
    }
}

impl DmaSpace for Snapshot {
    fn slices(&self, addr: u64, len: u64) -> Result<Slices<'_>, DmaFault> {
        self.ram.slices(addr, len)
    }

    fn flat(&self, addr: u64, len: u64) -> Option<VolatileSlice<'_>> {
        self.ram.flat(addr, len)
    }

    fn table(&self) -> Option<&RamTable> {
        self.ram.table()
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.held.fetch_sub(self.charge, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram() -> Arc<dyn DmaSpace> {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        Arc::new(GuestRam::new(m))
    }

    #[test]
    fn test_the_copy_keeps_the_bytes_sent_and_its_charge_until_dropped() {
        let guest = ram();
        guest.write(0x1000, &[7; 5000]).unwrap();
        let held = Arc::new(AtomicUsize::new(0));
        let sent = Payload::dma(
            guest.clone(),
            SegList::from_elem(
                Seg {
                    addr: 0x1000,
                    len: 5000,
                },
                1,
            ),
            None,
        );
        let copy = Snapshot::take(sent, &held).unwrap();
        assert_eq!(held.load(Ordering::Relaxed), 2 * PAGE);
        // The consumer's buffer is theirs again: what they write now is not what was sent.
        guest.write(0x1000, &[9; 5000]).unwrap();
        let piece = copy.slice(4096, 904);
        guest.write(0x8000, &[0; 5000]).unwrap();
        copy.scatter(
            guest.as_ref(),
            &[Seg {
                addr: 0x8000,
                len: 5000,
            }],
        )
        .unwrap();
        let mut back = [0u8; 5000];
        guest.read(0x8000, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 7));
        drop(copy);
        // A piece cut for a later packet still holds the copy, and its charge.
        assert_eq!(held.load(Ordering::Relaxed), 2 * PAGE);
        drop(piece);
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn test_a_payload_carried_inline_is_not_copied_again() {
        let held = Arc::new(AtomicUsize::new(0));
        let small = Payload::Bytes(vec![1, 2, 3]);
        assert!(matches!(
            Snapshot::take(small, &held),
            Ok(Payload::Bytes(b)) if b == [1, 2, 3]
        ));
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }
}
