//! hca-model: an emulated MT21108-like InfiniBand HCA, with no VM needed to run it.
//!
//! The device is a state machine behind three entry points a host adapter calls:
//! [`Hca::doorbell`] (the guest wrote BAR0's doorbell), the fabric's packet delivery, and
//! [`Hca::bar2`] (the device memory the host maps into the guest). It does DMA through
//! `vm_memory::GuestMemory` and raises MSI-X vectors through [`InterruptSink`]. The guest ABI
//! is in [`abi`] and `docs/hca-abi.md`; the threat model is that every value read from guest
//! memory or BAR2 is hostile: it is checked, and a bad one yields an error completion, an
//! error state or an async event, never a panic or an access outside the guest's memory.
//! Indexing, `unwrap` and `expect` that could panic are refused by the compiler (clippy's
//! `indexing_slicing`, `unwrap_used`, `expect_used`; the SA reads MADs typed as 256-byte
//! arrays, so its fixed offsets are checked at compile time).

#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)
)]

pub mod abi;
pub mod adapter_hook;
pub mod capture;
mod command;
mod completer;
mod cq;
pub mod devmem;
pub mod dma;
pub mod doorbell;
mod eq;
pub mod fabric;
pub mod faults;
mod hca;
mod mcast;
mod mr;
pub mod packet;
pub mod partition;
mod qp;
pub mod reliability;
mod requester;
mod responder;
pub mod sa;
mod snapshot;
mod sq_ring;
mod srq;
mod status;
pub mod sync;
mod turn;
pub mod uapi;
mod uar;

pub use abi::Lid;
pub use adapter_hook::{AdapterHook, IrqFate};
pub use devmem::DeviceMemory;
pub use dma::{DmaFault, DmaSpace, GuestRam};
pub use doorbell::DoorbellPump;
pub use fabric::{Fabric, FabricStats, LidTaken, LinkDir, LinkHook, LinkId, PacketTap, Verdict};
pub use hca::{Hca, HcaStats, InterruptSink, NoInterrupts};
pub use qp::WR_FIXED_BYTES;
pub use status::{CmdError, WcError};
