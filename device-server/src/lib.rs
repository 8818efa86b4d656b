//! The device server: one process hosting N hcabench HCAs and the fabric between them, for
//! Linux guests running under QEMU with `-device ivshmem-doorbell`.
//!
//! Each node has its own unix socket, so the server knows which guest is which whatever order
//! they connect in. Over it the server speaks the ivshmem server protocol: the guest's BAR2 is
//! a memfd of the device's memory, the guest's doorbell writes arrive on eventfds and become
//! [`hca_model::Hca::doorbell`] calls, and the model's interrupts go back on the eventfds QEMU
//! turns into MSI-X vectors. Guest RAM is a sealed memfd that QEMU and the server both map
//! (or a file QEMU creates, mapped on first use), so an RDMA WRITE is one copy from one
//! guest's RAM into another's.
//!
//! # Modules
//!
//! - This file: [`DeviceServer`], N HCAs and their fabric, a socket per node.
//! - `node`: one node's socket, its guest and its HCA.
//! - [`ivshmem`]: the ivshmem server protocol, and a client side for tests.
//! - [`memfd`]: size-sealed memfds (BAR2, guest RAM).
//! - `guest_ram`: a QEMU guest's RAM as this process maps it.
//! - [`trim`]: hands freed heap back to the system after a guest's burst.
//!
//! Tested by `tests/ivshmem_guests.rs`: stand-in QEMU clients driving the test driver
//! (greeting, doorbell to interrupt, lazy RAM, an RDMA WRITE between two guests' RAM memfds,
//! a dead guest taking only its HCA down).

#![cfg_attr(
    not(test),
    warn(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)
)]

mod guest_ram;
pub mod ivshmem;
pub mod memfd;
mod node;
pub mod trim;

use std::fmt;
use std::io;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hca_model::sync::Unpoisoned;
use hca_model::{Fabric, Hca};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use guest_ram::q35_layout;
pub use node::{NodeConfig, RamBacking, DEVICE_PEER, GUEST_PEER};

/// Why the server could not start or went down.
#[derive(Debug)]
pub enum ServerError {
    Listen { socket: PathBuf, source: io::Error },
    Epoll(io::Error),
    Eventfd(io::Error),
    Thread(io::Error),
    NoNodes,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Listen { socket, source } => write!(
                f,
                "cannot listen on {}: {source} (another device server running, or a stale \
                 socket left by one? stop it, or remove the file)",
                socket.display()
            ),
            ServerError::Epoll(e) => write!(f, "epoll failed: {e}"),
            ServerError::Eventfd(e) => write!(f, "cannot create an eventfd: {e}"),
            ServerError::Thread(e) => write!(f, "cannot start a node thread: {e}"),
            ServerError::NoNodes => write!(f, "a cluster needs at least one node"),
        }
    }
}

impl std::error::Error for ServerError {}

struct RunningNode {
    cfg: NodeConfig,
    stop: EventFd,
    thread: JoinHandle<Result<(), ServerError>>,
    current: Arc<Mutex<Option<Hca>>>,
}

/// A running device server. Node k (from 0) has LID k + 1. Dropping it shuts it down.
pub struct DeviceServer {
    fabric: Fabric,
    nodes: Vec<RunningNode>,
    /// Gives what the models freed back to the system (see [`trim`]).
    _trimmer: trim::Trimmer,
}

impl DeviceServer {
    /// Listens on every node's socket and serves guests until [`DeviceServer::shutdown`].
    pub fn start(configs: Vec<NodeConfig>) -> Result<Self, ServerError> {
        if configs.is_empty() {
            return Err(ServerError::NoNodes);
        }
        let fabric = Fabric::new();
        let mut server = DeviceServer {
            fabric: fabric.clone(),
            nodes: Vec::new(),
            _trimmer: trim::Trimmer::start().map_err(ServerError::Thread)?,
        };
        for cfg in configs {
            let listener =
                UnixListener::bind(&cfg.socket).map_err(|source| ServerError::Listen {
                    socket: cfg.socket.clone(),
                    source,
                })?;
            let stop = EventFd::new(EFD_NONBLOCK).map_err(ServerError::Eventfd)?;
            let current = Arc::new(Mutex::new(None));
            let worker = node::NodeThread {
                cfg: cfg.clone(),
                lid: cfg.lid,
                fabric: fabric.clone(),
                listener,
                stop: stop.try_clone().map_err(ServerError::Eventfd)?,
                current: current.clone(),
                next_qpn: Default::default(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("hca-{}", cfg.name))
                .spawn(move || worker.run())
                .map_err(ServerError::Thread)?;
            server.nodes.push(RunningNode {
                cfg,
                stop,
                thread,
                current,
            });
        }
        Ok(server)
    }

    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The HCA of node `index`'s connected guest, if one is connected.
    pub fn hca(&self, index: usize) -> Option<Hca> {
        let n = self.nodes.get(index)?;
        n.current.lock_unpoisoned().clone()
    }

    /// Stops every node, drops their guests' devices and removes the sockets.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), ServerError> {
        let mut first_error = None;
        for n in self.nodes.drain(..) {
            let _ = n.stop.write(1);
            match n.thread.join() {
                Ok(Err(e)) => first_error = first_error.or(Some(e)),
                Err(_) => log::error!("{}: node thread panicked", n.cfg.name),
                Ok(Ok(())) => {}
            }
            let _ = std::fs::remove_file(&n.cfg.socket);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for DeviceServer {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}
