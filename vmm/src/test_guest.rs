//! The bare-metal test guest (vmm/guest, built by build.rs) and the host's half of its
//! exchange block: the out-of-band channel through which two test VMs learn each other's
//! LID, QPN, rkey and buffer address (what a cluster's connection manager does for Linux
//! guests).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// A flat binary entered in 64-bit mode at [`TEST_GUEST_ENTRY`]. Empty when gcc was
/// missing at build time.
pub const TEST_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hcatest.bin"));
pub const TEST_GUEST_ENTRY: u64 = 0x10_0000;
pub const TEST_GUEST_STACK: u64 = 0x8_0000;

/// `struct xchg` in vmm/guest/hcatest.h.
const XCHG_ADDR: u64 = 0x6000;
const XCHG_MAGIC: u32 = 0x4748_4358;
const SELF_OFF: u64 = 8;
const PEER_OFF: u64 = 32;
/// `struct xchg_side`: ready, lid, qpn, rkey (u32 each), addr (u64).
const SIDE_BYTES: usize = 24;

/// The exchange block could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("exchange block: {0}")]
pub struct ExchangeError(#[from] vm_memory::GuestMemoryError);

/// What a test guest does after the single-VM checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The single-VM checks only.
    Alone = 0,
    /// Posts an RDMA Write into the peer's buffer and waits for its completion.
    Writer = 1,
    /// Waits for the peer's RDMA Write and checks every byte.
    Target = 2,
    /// Reads one line from the serial port and prints it back ("HCATEST echo LINE").
    Echo = 3,
}

/// Gives the guest in `mem` its role (before it runs).
pub fn set_role(mem: &GuestMemoryMmap, role: Role) -> Result<(), ExchangeError> {
    let w = |off: u64, v: u32| mem.write_obj(v, GuestAddress(XCHG_ADDR + off));
    w(0, XCHG_MAGIC)?;
    w(4, role as u32)?;
    Ok(())
}

/// Copies each guest's published side into the other's peer side, the ready word last (a
/// guest reads the rest only after it sees ready move). Call it repeatedly while both run.
pub fn mirror(a: &GuestMemoryMmap, b: &GuestMemoryMmap) -> Result<(), ExchangeError> {
    copy_side(a, b)?;
    copy_side(b, a)
}

/// The guest writes its side's fields before its ready word, so reading ready first and
/// the fields after it never pairs a new ready with stale fields.
fn copy_side(from: &GuestMemoryMmap, to: &GuestMemoryMmap) -> Result<(), ExchangeError> {
    use std::sync::atomic::{fence, Ordering};
    let ready: u32 = from.read_obj(GuestAddress(XCHG_ADDR + SELF_OFF))?;
    fence(Ordering::SeqCst);
    let mut fields = [0u8; SIDE_BYTES - 4];
    from.read_slice(&mut fields, GuestAddress(XCHG_ADDR + SELF_OFF + 4))?;
    to.write_slice(&fields, GuestAddress(XCHG_ADDR + PEER_OFF + 4))?;
    fence(Ordering::SeqCst);
    to.write_obj(ready, GuestAddress(XCHG_ADDR + PEER_OFF))?;
    Ok(())
}
