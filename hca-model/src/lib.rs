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
//!
//! # Modules
//!
//! This is the crate's map, kept here only (`cargo doc --open -p hca-model`); modules that
//! are not public are named by their file.
//!
//! The guest's view of the device:
//! - [`abi`]: the guest ABI: BAR0 and BAR2 layouts, commands, WQEs, CQEs, EQEs, limits.
//! - [`uapi`]: the user verbs ABI between the guest's hca_ib and libhcab.
//! - [`devmem`]: BAR2, the device memory the host maps into the guest.
//! - [`doorbell`]: the pump that turns eventfd doorbells into [`Hca::doorbell`] calls.
//! - `uar.rs`: where a queue's doorbell record lives (BAR2, or a process's UAR page).
//! - `sq_ring.rs`: send-doorbell rings, naming the QPs a send doorbell is for.
//! - [`dma`]: DMA into guest memory, with every address checked.
//!
//! The device:
//! - `hca.rs`: [`Hca`], its lock and entry points; the QP table beside the `Device`.
//! - `turn.rs`: what one turn under the device lock keeps until it lets go.
//! - `command.rs`: the command mailbox, one command at a time.
//! - `mr.rs`: PDs, MRs and the checks of lkeys and rkeys.
//! - `cq.rs`, `eq.rs`, `srq.rs`: CQ rings, EQ rings and their interrupts, shared receive
//!   queues.
//! - `mcast.rs`: UD QPs attached to multicast groups.
//! - `status.rs`: [`CmdError`] and [`WcError`], the ABI's failure codes.
//!
//! The transport engine, one QP at a time (as rxe splits it):
//! - `qp.rs`: the QP's state machine, and flushing.
//! - `requester.rs`: send WQEs read, checked and cut into packets.
//! - `snapshot.rs`: a UC message's bytes, copied as it is sent.
//! - `completer.rs`: ACKs, NAKs and responses completing the WRs sent.
//! - `responder.rs`: requests taken off the fabric, answered and completed.
//! - `answers.rs`: what a responder owes, sent in order: long READ responses made a piece
//!   at a time.
//! - [`reliability`]: RC's transport timer, retransmission and NAKs.
//! - [`packet`]: packets shaped as IB's headers, and message trains.
//!
//! The fabric and its subnet management:
//! - [`fabric`]: the switch: ports, queues, the pump, the cut-through, the clock.
//! - [`partition`]: P_Key tables and who may talk to whom.
//! - [`sa`]: the subnet administrator, the SM and the switch's PMA, answering MADs.
//! - [`subnet`]: the switches, their links and the forwarding tables the SM programs.
//! - [`faults`]: seeded fault plans for links, nodes and adapters.
//! - [`adapter_hook`]: the hook an HCA consults at its own decision points.
//! - [`capture`]: every packet written to a pcap file.
//! - [`wire`]: the frames inter-host links carry: IB packets in UDP datagrams.
//!
//! Support: [`sync`], locks that outlive a panic.

#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)
)]

pub mod abi;
pub mod adapter_hook;
mod answers;
pub mod capture;
mod catas;
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
pub mod sma;
mod snapshot;
mod sq_ring;
mod srq;
mod status;
pub mod subnet;
pub mod sync;
mod turn;
pub mod uapi;
mod uar;
pub mod wire;

pub use abi::Lid;
pub use adapter_hook::{AdapterHook, IrqFate};
pub use devmem::DeviceMemory;
pub use dma::{DmaFault, DmaSpace, GuestRam};
pub use doorbell::DoorbellPump;
pub use fabric::{
    AdapterFault, Fabric, FabricStats, LidTaken, LinkDir, LinkHook, LinkId, PacketTap, Verdict,
};
pub use hca::{Hca, HcaStats, InterruptSink, NoInterrupts};
pub use qp::{INBOUND_WINDOW, INBOUND_WINDOW_RECORDS, WINDOW_FLOOR, WR_FIXED_BYTES, WR_SLOT_BYTES};
pub use status::{CmdError, WcError};
