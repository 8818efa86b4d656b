//! One launcher for every hcabench cluster: `hcabench up` (its daemon), `run <app>`, every
//! `bench`, and the end-to-end tests boot N Linux guests here, under either backend:
//!
//! - [`Backend::Qemu`]: a QEMU process per guest ([`qemu`]), its HCA in a
//!   [`device_server::DeviceServer`] in this process over ivshmem;
//! - [`Backend::Kvm`]: a VM per guest in hcabench's own VMM ([`kvm`]), HCA and all in this
//!   process.
//!
//! Either way node `k` (from 0) is `node{k+1}` at LID `k + 1` on one [`Fabric`] (one switch,
//! or the several [`switches`] the spec cables), its serial
//! console is logged to `dir/node{k+1}.console` (and served on `dir/node{k+1}.serial` when
//! asked, with its second serial port, the shell job's command channel, on
//! `dir/node{k+1}.agent`), and a [`Cluster`] kills, watches and tears down its nodes the
//! same way. On top:
//! the guest's console protocol ([`console_protocol`]), its agent shell ([`agent`]), and the
//! verbs and DSM jobs run through it ([`verbs`], [`dsm`]).
//!
//! # Modules
//!
//! - This file: [`Cluster`], [`ClusterSpec`], [`BootError`]: a cluster booted, watched and
//!   torn down.
//! - [`backend`]: [`Backend`], the automatic choice between them, and the advice when KVM
//!   cannot run Linux guests.
//! - `image`: the guest image `images/build.py` made (kernel, initramfs, userland disk).
//! - [`node`]: the `Node` trait every guest answers to (console, `wait_line`, kill, its HCA).
//! - [`qemu`]: QEMU guests wired to the device server; [`kvm`]: VMs in hcabench's VMM.
//! - [`hotplug`]: a QEMU guest's HCA hot-unplugged and plugged again through its monitor.
//! - [`hosts`]: a cluster that spans hosts: which runs which nodes, its switches on them.
//! - [`interhost`]: the UDP network between hcabench hosts that share one subnet.
//! - [`console_protocol`]: the `HCABENCH-` lines `images/init.sh` prints (a test holds the
//!   two together, and init.sh's PCI IDs to `hca_model::abi`'s).
//! - [`agent`]: a command channel into a guest's shell over a serial port.
//! - [`verbs`]: `Testbed`, a cluster under agent control; the vbench runs.
//! - [`dsm`]: the DSM's mesh, applications on every guest at once.
//! - [`udsm`]: the user-level DSM's runs (libdsm over libibverbs), their rendezvous.
//! - [`mpi`]: MPICH and Open MPI jobs across the guests, launched through their shells.
//! - [`switches`]: a subnet of several switches by name, cabled as the model's topology.
//! - `private_dir`: run directories only their owner may enter.

pub mod agent;
pub mod backend;
pub mod console_protocol;
pub mod dsm;
pub mod ethernet;
pub mod hosts;
pub mod hotplug;
mod image;
pub mod interhost;
pub mod kvm;
pub mod mpi;
pub mod node;
mod private_dir;
pub mod qemu;
pub mod switches;
pub mod udsm;
pub mod verbs;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use device_server::{DeviceServer, NodeConfig, ServerError};
use hca_model::{Fabric, Hca};

pub use backend::{Backend, BackendError};
pub use hosts::{HostSpec, HostsError, HostsSpec};
pub use image::{is_kernel_path, BuildError, Image, ImageError, USERLAND_SERIAL};
pub use node::Node;
pub use private_dir::{create_private_dir, peer_cred};
pub use switches::{SwitchSpec, TopologySpec, TopologySpecError};

use kvm::{KvmNode, KvmNodeSpec};
use qemu::{GuestSpec, NetSpec, QemuNode};

/// Which accelerator QEMU guests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QemuAccel {
    /// TCG: works everywhere.
    Tcg,
    /// `-accel kvm -cpu host` (only where KVM runs Linux; `bench vmm` compares it with the VMM).
    Kvm,
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub backend: Backend,
    pub image: Image,
    /// Consoles and sockets go here (created if missing).
    pub dir: PathBuf,
    pub nodes: usize,
    /// Each guest's RAM in MiB, but for those in `ram_mib_of`.
    pub ram_mib: u64,
    /// Node name -> its RAM in MiB where it differs from `ram_mib` (a storage target that
    /// serves many hosts, say).
    pub ram_mib_of: BTreeMap<String, u64>,
    pub vcpus: u32,
    /// Appended to every guest's kernel command line.
    pub kernel_args: String,
    /// What the guests' init runs after boot (`hcabench.cmd=`): `shell`, `agent`, ...
    pub job: String,
    /// Serve every console on `dir/<node>.serial` (for `hcabench console` and the agent).
    pub console_sockets: bool,
    /// A virtio-net NIC in every guest, all on one Ethernet segment, for SoftRoCE (see
    /// [`ethernet`]; QEMU's virtio-net-pci, or the VMM's virtio-net on virtio-mmio).
    pub link: bool,
    pub qemu_accel: QemuAccel,
    /// Node name -> host PCI function passed through (the VMM, `vfio` feature).
    pub vfio: BTreeMap<String, PathBuf>,
    /// The PacketLifeTime the fabric's SA gives paths (OpenSM's `packet_life_time`): the
    /// kernel's ib_cm makes an RC connection's ACK timeout 4.096 us * 2^(life + 1), so it
    /// sets how long a lost packet stalls a connection.
    pub packet_life: u8,
    /// Host memory each node's HCA may hold for its guest's requests in flight, MiB
    /// (`Hca::set_in_flight_budget`).
    pub device_memory_mib: u64,
    /// Partitions beside the default one every node is a full member of (see
    /// `hca_model::partition`).
    pub partitions: Vec<PartitionSpec>,
    /// The subnet's switches and the links between them (default: one switch every node
    /// is on), cabled before any guest runs.
    pub topology: TopologySpec,
    /// The hosts the cluster spans, and which this is (default: this one alone). Only
    /// this host's nodes boot here; `nodes` counts every host's.
    pub hosts: HostsSpec,
    /// A user's subnet manager in a guest (OpenSM) manages the subnet, not the fabric's
    /// own: the ports wait in INIT for it (`hca_model::fabric::Fabric::set_guest_sm`).
    pub guest_sm: bool,
}

/// One partition of a cluster: its P_Key (the membership bit is each node's own) and its
/// full and limited members by node name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionSpec {
    pub pkey: u16,
    pub members: Vec<String>,
    pub limited: Vec<String>,
}

impl PartitionSpec {
    /// The partition with its members as LIDs (node `i` has LID `i + 1`) in a cluster of
    /// `nodes`; Err names a member that is not a node.
    pub fn with_lids(&self, nodes: usize) -> Result<hca_model::partition::Partition, SpecError> {
        let lids = |names: &[String]| -> Result<Vec<u16>, SpecError> {
            (names.iter())
                .map(|n| {
                    ClusterSpec::node_index(n, nodes)
                        .map(|i| (i + 1) as u16)
                        .ok_or_else(|| SpecError::NotANode {
                            what: "partition member",
                            name: n.clone(),
                            nodes,
                        })
                })
                .collect()
        };
        Ok(hca_model::partition::Partition {
            pkey: self.pkey,
            members: lids(&self.members)?,
            limited: lids(&self.limited)?,
        })
    }
}

impl ClusterSpec {
    /// `nodes` guests of 256 MiB and one vCPU each, running the shell job, consoles on
    /// sockets.
    pub fn new(backend: Backend, image: Image, dir: PathBuf, nodes: usize) -> ClusterSpec {
        ClusterSpec {
            backend,
            image,
            dir,
            nodes,
            ram_mib: 256,
            ram_mib_of: BTreeMap::new(),
            vcpus: 1,
            kernel_args: String::new(),
            job: "shell".into(),
            console_sockets: true,
            link: false,
            qemu_accel: QemuAccel::Tcg,
            vfio: BTreeMap::new(),
            packet_life: hca_model::sa::DEFAULT_PACKET_LIFE,
            guest_sm: false,
            device_memory_mib: (hca_model::abi::MAX_IN_FLIGHT_BYTES >> 20) as u64,
            partitions: Vec::new(),
            topology: TopologySpec::default(),
            hosts: HostsSpec::default(),
        }
    }

    /// The nodes that boot on this host (all of them, unless the cluster spans hosts).
    pub fn local_nodes(&self) -> std::ops::Range<usize> {
        self.hosts.local_nodes(self.nodes)
    }

    /// Node `i`'s name.
    pub fn node_name(i: usize) -> String {
        format!("node{}", i + 1)
    }

    /// The node whose name is `name` (as [`ClusterSpec::node_name`] writes it: `node1`,
    /// not `node01`), if it is among the first `nodes`.
    pub fn node_index(name: &str, nodes: usize) -> Option<usize> {
        let i = name
            .strip_prefix("node")?
            .parse::<usize>()
            .ok()?
            .checked_sub(1)?;
        (i < nodes && Self::node_name(i) == name).then_some(i)
    }

    /// Each HCA's budget for requests in flight, bytes.
    pub fn in_flight_budget(&self) -> usize {
        usize::try_from(self.device_memory_mib << 20).unwrap_or(usize::MAX)
    }

    /// Node `i`'s RAM in MiB.
    pub fn node_ram_mib(&self, i: usize) -> u64 {
        let own = self.ram_mib_of.get(&Self::node_name(i));
        own.copied().unwrap_or(self.ram_mib)
    }

    pub fn console_log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.console", Self::node_name(i)))
    }

    pub fn console_socket(&self, i: usize) -> Option<PathBuf> {
        self.console_sockets
            .then(|| self.dir.join(format!("{}.serial", Self::node_name(i))))
    }

    /// Node `i`'s second serial port (ttyS1) on a socket, where the shell job's init runs
    /// the command channel of `hcabench exec` and `cp` ([`agent`]); with the console's.
    pub fn agent_socket(&self, i: usize) -> Option<PathBuf> {
        self.console_sockets
            .then(|| self.dir.join(format!("{}.agent", Self::node_name(i))))
    }

    /// Node `i`'s QEMU monitor (QMP), for the HCA's hot-unplug and hot-plug
    /// ([`hotplug`]); QEMU guests only.
    pub fn qmp_socket(&self, i: usize) -> PathBuf {
        hotplug::qmp_socket(&self.dir, &Self::node_name(i))
    }

    /// Gives the fabric's subnet manager this cluster's settings, before any guest runs.
    fn set_up_subnet(&self, fabric: &Fabric) -> Result<(), SpecError> {
        if !self.topology.is_single() || self.hosts.spans() {
            let t = self.hosts.topology(&self.topology, self.nodes)?;
            fabric.set_topology_on(t, self.hosts.here as u16);
        }
        fabric
            .set_packet_life(self.packet_life)
            .ok_or(SpecError::PacketLife(self.packet_life))?;
        if self.guest_sm {
            // The user's SM sets the partitions, and nothing else is the fabric's to set.
            if !self.partitions.is_empty() {
                return Err(SpecError::GuestSmPartitions);
            }
            return fabric.set_guest_sm().map_err(SpecError::GuestSm);
        }
        fabric
            .set_partitions(&self.partitions()?)
            .map_err(SpecError::Partitions)?;
        Ok(())
    }

    /// The partitions with their nodes as LIDs.
    fn partitions(&self) -> Result<Vec<hca_model::partition::Partition>, SpecError> {
        (self.partitions.iter())
            .map(|p| p.with_lids(self.nodes))
            .collect()
    }

    fn check(&self) -> Result<(), SpecError> {
        if self.nodes == 0 {
            return Err(SpecError::NoNodes);
        }
        let named = |n: &String| Self::node_index(n, self.nodes).is_some();
        if let Some(n) = self.ram_mib_of.keys().find(|n| !named(n)) {
            return Err(SpecError::MemoryFor {
                name: n.clone(),
                nodes: self.nodes,
            });
        }
        if !self.vfio.is_empty() && self.backend != Backend::Kvm {
            return Err(SpecError::VfioBackend);
        }
        if self.qemu_accel == QemuAccel::Kvm && self.backend != Backend::Qemu {
            return Err(SpecError::AccelKvm);
        }
        self.hosts.topology(&self.topology, self.nodes)?;
        Ok(())
    }

    /// Joins the other hosts, when the cluster spans hosts.
    fn join_hosts(&self, fabric: &Fabric) -> Result<Option<interhost::Interhost>, BootError> {
        if !self.hosts.spans() {
            return Ok(None);
        }
        let addrs = self.hosts.addresses();
        let here = self.hosts.here as u16;
        interhost::Interhost::join(fabric, here, &addrs)
            .map(Some)
            .map_err(|source| BootError::Interhost {
                address: addrs.get(self.hosts.here).copied(),
                source,
            })
    }
}

/// Why a cluster did not boot.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The spec asks for something the backend cannot do.
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("cannot create {}: {source}", .dir.display())]
    Dir { dir: PathBuf, source: io::Error },
    #[error("device server: {0}")]
    DeviceServer(#[source] ServerError),
    /// Guest RAM (a sealed memfd per QEMU guest) could not be made.
    #[error("cannot create guest RAM (a sealed memfd): {0}")]
    Ram(#[source] io::Error),
    /// /dev/kvm would not open.
    #[error("/dev/kvm: {0}")]
    Kvm(#[source] io::Error),
    /// A node's QEMU or VM would not start.
    #[error("{node}: cannot start its guest: {source}")]
    Start { node: String, source: StartError },
    /// This host's address for the others would not bind.
    #[error("cannot listen for the other hosts at {}: {source}", .address.map_or("(no address)".to_string(), |a| a.to_string()))]
    Interhost {
        address: Option<std::net::SocketAddr>,
        source: io::Error,
    },
    /// No two free UDP ports on 127.0.0.1 for the virtio-net link.
    #[error("no UDP ports on 127.0.0.1 for the guests' Ethernet segment: {0}")]
    Link(#[source] io::Error),
}

/// What in a cluster's spec its backend or its nodes cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("a cluster needs at least one node")]
    NoNodes,
    /// `what` (a partition member, ...) names `name`, which is not one of the `nodes`.
    #[error("{what} {name} is not a node (the nodes are node1 to node{nodes})")]
    NotANode {
        what: &'static str,
        name: String,
        nodes: usize,
    },
    #[error("memory for {name}, which is not a node (the nodes are node1 to node{nodes})")]
    MemoryFor { name: String, nodes: usize },
    #[error("VFIO passthrough needs the kvm backend")]
    VfioBackend,
    #[error("-accel kvm is a QEMU setting")]
    AccelKvm,
    #[error(
        "packet lifetime {0} is past {max} (a QP's ACK timeout has 5 bits)",
        max = hca_model::sa::MAX_PACKET_LIFE
    )]
    PacketLife(u8),
    #[error(transparent)]
    Partitions(hca_model::partition::PartitionError),
    #[error(transparent)]
    GuestSm(hca_model::fabric::UserSmError),
    #[error("partitions are the guest SM's to set (its partitions.conf), not the cluster file's")]
    GuestSmPartitions,
    #[error(transparent)]
    Topology(#[from] TopologySpecError),
    /// (Boxed: it names several things, and specs' errors are returned by value.)
    #[error(transparent)]
    Hosts(Box<HostsError>),
}

impl From<HostsError> for SpecError {
    fn from(e: HostsError) -> Self {
        SpecError::Hosts(Box::new(e))
    }
}

/// Why a node's QEMU or VM would not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start QEMU: {0}")]
    Qemu(#[source] io::Error),
    #[error("{0} vCPUs: too many")]
    Vcpus(u32),
    #[error(transparent)]
    Machine(#[from] vmm::machine::MachineError),
}

/// How many times a guest whose kernel crashed before init is booted again
/// ([`Cluster::wait_booted`]).
pub const BOOT_RETRIES: u32 = 2;

/// A booted cluster. Dropping it stops every guest and removes its sockets (guest RAM goes
/// with the last process holding it);
/// the console logs stay.
pub struct Cluster {
    backend: Backend,
    nodes: Vec<Box<dyn Node>>,
    server: Option<DeviceServer>,
    fabric: Fabric,
    /// Guests that stopped or were killed, already reported by [`Cluster::newly_stopped`].
    gone: Vec<bool>,
    /// Sockets that go with the cluster.
    files: Vec<PathBuf>,
    /// The guests' Ethernet segment, when they have NICs.
    hub: Option<ethernet::EthernetHub>,
    /// The network to the other hosts, when the cluster spans hosts.
    interhost: Option<interhost::Interhost>,
}

impl Cluster {
    /// Starts every node's guest (it does not wait for them: see [`Cluster::wait_all`]).
    /// `progress` hears about each step.
    pub fn boot(spec: &ClusterSpec, progress: &mut dyn FnMut(&str)) -> Result<Cluster, BootError> {
        spec.check()?;
        create_private_dir(&spec.dir).map_err(|source| BootError::Dir {
            dir: spec.dir.clone(),
            source,
        })?;
        let local = spec.local_nodes();
        let mut files: Vec<PathBuf> = (local.clone())
            .flat_map(|i| [spec.console_socket(i), spec.agent_socket(i)])
            .flatten()
            .collect();
        let mut cluster = match spec.backend {
            Backend::Qemu => {
                qemu::qemu_available()?;
                let ram: Vec<u64> = (local.clone())
                    .map(|i| spec.node_ram_mib(i) << 20)
                    .collect();
                let first = (local.start + 1) as u16;
                let mut configs =
                    NodeConfig::cluster_from(&spec.dir, first, &ram).map_err(BootError::Ram)?;
                for c in &mut configs {
                    c.in_flight_budget = spec.in_flight_budget();
                }
                files.extend(configs.iter().map(|n| n.socket.clone()));
                remove_all(&files);
                let server =
                    DeviceServer::start(configs.clone()).map_err(BootError::DeviceServer)?;
                spec.set_up_subnet(server.fabric())?;
                Cluster {
                    backend: spec.backend,
                    nodes: Vec::new(),
                    fabric: server.fabric().clone(),
                    interhost: spec.join_hosts(server.fabric())?,
                    server: Some(server),
                    gone: Vec::new(),
                    files,
                    hub: None,
                }
                .start_qemu(spec, configs, progress)?
            }
            Backend::Kvm => {
                remove_all(&files);
                let kvm = kvm_ioctls::Kvm::new()
                    .map_err(|e| BootError::Kvm(io::Error::from_raw_os_error(e.errno())))?;
                let mut c = Cluster {
                    backend: spec.backend,
                    nodes: Vec::new(),
                    server: None,
                    fabric: Fabric::new(),
                    gone: Vec::new(),
                    files,
                    hub: None,
                    interhost: None,
                };
                spec.set_up_subnet(&c.fabric)?;
                c.interhost = spec.join_hosts(&c.fabric)?;
                if spec.link {
                    let hub = ethernet::EthernetHub::start(spec.nodes).map_err(BootError::Link)?;
                    c.hub = Some(hub);
                }
                for i in local {
                    let name = ClusterSpec::node_name(i);
                    progress(&format!("starting {name} (hcabench's VMM)"));
                    let node = KvmNodeSpec {
                        name: &name,
                        lid: (i + 1) as u16,
                        ram_mib: spec.node_ram_mib(i),
                        vcpus: spec.vcpus,
                        cmd: &spec.job,
                        kernel_args: &spec.kernel_args,
                        console_log: spec.console_log(i),
                        console_socket: spec.console_socket(i),
                        agent_socket: spec.agent_socket(i),
                        vfio: spec.vfio.get(&name).cloned().into_iter().collect(),
                        in_flight_budget: spec.in_flight_budget(),
                        nic: c.hub.as_ref().and_then(|hub| {
                            Some(vmm::virtio_net::NicConfig {
                                mac: guest_mac(i),
                                port: hub.guest_port(i)?,
                                hub_port: hub.port(),
                            })
                        }),
                    };
                    let n = KvmNode::start(&kvm, &spec.image, node, &c.fabric)
                        .map_err(|source| BootError::Start { node: name, source })?;
                    c.nodes.push(Box::new(n));
                }
                c
            }
        };
        cluster.gone = vec![false; cluster.nodes.len()];
        Ok(cluster)
    }

    fn start_qemu(
        mut self,
        spec: &ClusterSpec,
        configs: Vec<NodeConfig>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Cluster, BootError> {
        if spec.link {
            let hub = ethernet::EthernetHub::start(spec.nodes).map_err(BootError::Link)?;
            self.hub = Some(hub);
        }
        let local = spec.local_nodes();
        for (i, node) in local.zip(configs) {
            let name = node.name.clone();
            let g = GuestSpec {
                console_log: spec.console_log(i),
                console_socket: spec.console_socket(i),
                agent_socket: spec.agent_socket(i),
                node,
                image: spec.image.clone(),
                vcpus: spec.vcpus,
                kvm: spec.qemu_accel == QemuAccel::Kvm,
                cmd: spec.job.clone(),
                kernel_args: spec.kernel_args.clone(),
                net: self.hub.as_ref().and_then(|hub| {
                    let m = guest_mac(i);
                    Some(NetSpec {
                        local_port: hub.guest_port(i)?,
                        remote_port: hub.port(),
                        mac: format!(
                            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                            m[0], m[1], m[2], m[3], m[4], m[5]
                        ),
                    })
                }),
                qmp_socket: Some(spec.qmp_socket(i)),
            };
            progress(&format!("starting {name}"));
            let guest = QemuNode::spawn(&g).map_err(|e| BootError::Start {
                node: name,
                source: StartError::Qemu(e),
            })?;
            self.nodes.push(Box::new(guest));
        }
        Ok(self)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The guests' Ethernet segment, when they have NICs ([`ClusterSpec::link`]).
    pub fn ethernet(&self) -> Option<&ethernet::EthernetHub> {
        self.hub.as_ref()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The fabric between the guests' HCAs (the device server's, or the VMM's).
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    pub fn node(&self, i: usize) -> &dyn Node {
        self.nodes[i].as_ref()
    }

    pub fn node_mut(&mut self, i: usize) -> &mut dyn Node {
        self.nodes[i].as_mut()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &dyn Node> {
        self.nodes.iter().map(|n| n.as_ref())
    }

    pub fn nodes_mut(&mut self) -> impl Iterator<Item = &mut Box<dyn Node>> {
        self.nodes.iter_mut()
    }

    /// Node `i`'s HCA while it is on the fabric.
    pub fn hca(&self, i: usize) -> Option<Hca> {
        match &self.server {
            Some(s) => s.hca(i),
            None => self.nodes.get(i).and_then(|n| n.hca()),
        }
    }

    /// Every HCA on the fabric now.
    pub fn hcas(&self) -> Vec<Hca> {
        (0..self.nodes.len()).filter_map(|i| self.hca(i)).collect()
    }

    /// Waits until every guest printed a console line starting with `prefix`; says when
    /// each did.
    pub fn wait_all(
        &mut self,
        prefix: &str,
        timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), node::WaitError> {
        for i in 0..self.nodes.len() {
            let took = self.wait_booted(i, prefix, timeout)?;
            progress(&format!("{} booted ({took:.1?})", self.nodes[i].name()));
        }
        Ok(())
    }

    /// Waits for node `i`'s console line starting with `prefix` as [`Node::wait_line`]
    /// does, booting the guest again (up to [`BOOT_RETRIES`] times, each said on stderr)
    /// when its kernel crashes before init ([`node::crash_before_init`]); when the line
    /// came, counted from the last boot.
    pub fn wait_booted(
        &mut self,
        i: usize,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Duration, node::WaitError> {
        let mut attempt = 0;
        loop {
            match self.nodes[i].wait_line(prefix, timeout) {
                Ok((_, took)) => return Ok(took),
                Err(e @ node::WaitError::Stopped { .. }) if attempt < BOOT_RETRIES => {
                    attempt += 1;
                    if !self.boot_again_if_crashed(i, attempt) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Boots node `i`'s stopped guest again, as its `attempt`-th boot after a crash, when
    /// its kernel crashed before init ([`node::crash_before_init`]), saying so on stderr;
    /// false when it did not (the guest stays stopped).
    pub fn boot_again_if_crashed(&mut self, i: usize, attempt: u32) -> bool {
        let n = &mut self.nodes[i];
        if n.is_running() {
            return false;
        }
        let Some(crash) = node::crash_before_init(&n.console()) else {
            return false;
        };
        match n.boot_again(attempt) {
            Ok(Some(kept)) => eprintln!(
                "{}: the guest's kernel crashed before init ({}); booting it again ({attempt} \
                 of {BOOT_RETRIES}), the crashed console kept in {}",
                n.name(),
                crash.trim(),
                kept.display()
            ),
            Ok(None) => return false,
            Err(err) => {
                eprintln!("{}: cannot boot the guest again: {err}", n.name());
                return false;
            }
        }
        self.gone[i] = false;
        true
    }

    /// Stops node `i`'s guest at once, as a crash would: its HCA leaves the fabric and its
    /// peers' work requests to it fail. False if it was gone already.
    pub fn kill(&mut self, i: usize) -> bool {
        match self.gone.get_mut(i) {
            Some(gone) if !*gone => {
                *gone = true;
                self.nodes[i].kill();
                true
            }
            _ => false,
        }
    }

    /// Nodes whose guests stopped on their own since the last call, with why.
    pub fn newly_stopped(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, (n, gone)) in self.nodes.iter_mut().zip(&mut self.gone).enumerate() {
            if !*gone {
                if let Some(why) = n.stopped() {
                    *gone = true;
                    out.push((i, why));
                }
            }
        }
        out
    }

    /// Stops every guest now (the cluster's files go when it is dropped).
    pub fn kill_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Guest `i`'s NIC's MAC address (QEMU's locally administered prefix, then the node's
/// number), the same under either backend.
fn guest_mac(i: usize) -> [u8; 6] {
    let n = (i + 1) as u16;
    [0x52, 0x54, 0x00, 0x12, 0x34 + (n >> 8) as u8, n as u8]
}

fn remove_all(files: &[PathBuf]) {
    for f in files {
        let _ = std::fs::remove_file(f);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
        // The VMs (and their HCAs) go before their files; the server stops after its guests.
        self.nodes.clear();
        self.hub = None;
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
        remove_all(&self.files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(backend: Backend) -> ClusterSpec {
        let image = Image {
            kernel_version: "6.1".into(),
            name: "6.1".into(),
            vmlinux: "/nonexistent/vmlinux".into(),
            bzimage: "/nonexistent/bzImage".into(),
            initramfs: "/nonexistent/initramfs".into(),
            userland: None,
        };
        ClusterSpec::new(backend, image, std::env::temp_dir().join("hcab-spec"), 3)
    }

    #[test]
    fn test_a_node_name_reads_back_as_its_index_only_when_written_as_node_name_writes_it() {
        for i in [0, 1, 63] {
            assert_eq!(
                ClusterSpec::node_index(&ClusterSpec::node_name(i), 64),
                Some(i)
            );
        }
        for name in [
            "node0", "node01", "node65", "nodes", "node", "Node1", "node-1",
        ] {
            assert_eq!(ClusterSpec::node_index(name, 64), None, "{name}");
        }
        assert_eq!(
            ClusterSpec::node_index("node3", 2),
            None,
            "past the cluster's nodes"
        );
    }

    #[test]
    fn test_a_spec_the_backend_cannot_honour_is_refused_before_anything_starts() {
        let mut s = spec(Backend::Qemu);
        s.vfio
            .insert("node1".into(), "/sys/bus/pci/devices/x".into());
        let e = Cluster::boot(&s, &mut |_| {}).err().unwrap().to_string();
        assert!(e.contains("needs the kvm backend"), "{e}");
        let mut s = spec(Backend::Qemu);
        s.nodes = 0;
        assert!(matches!(
            Cluster::boot(&s, &mut |_| {}),
            Err(BootError::Spec(_))
        ));
    }

    #[test]
    fn test_the_fabric_is_cabled_as_the_spec_says_before_any_guest_runs() {
        let mut s = spec(Backend::Qemu);
        s.topology = TopologySpec {
            switches: (1..=3)
                .map(|n| SwitchSpec {
                    name: format!("s{}", n - 1),
                    nodes: vec![format!("node{n}")],
                    ..SwitchSpec::default()
                })
                .collect(),
            links: vec![["s0".into(), "s1".into()], ["s1".into(), "s2".into()]],
        };
        let fabric = Fabric::with_manual_clock();
        s.set_up_subnet(&fabric).unwrap();
        let subnet = fabric.subnet();
        let names: Vec<&str> = subnet.switches().iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["s0", "s1", "s2"]);
        assert_eq!(subnet.attachment(3), Some((2, 1)), "node3 on s2's port 1");
        // A cabling the model refuses stops the boot before anything starts.
        s.topology.links.pop();
        let e = Cluster::boot(&s, &mut |_| {}).err().unwrap().to_string();
        assert!(e.contains("switch \"s2\" is not linked to \"s0\""), "{e}");
    }

    #[test]
    fn test_nodes_are_named_and_their_consoles_placed_one_way() {
        let mut s = spec(Backend::Qemu);
        assert_eq!(ClusterSpec::node_name(2), "node3");
        assert_eq!(s.console_log(0), s.dir.join("node1.console"));
        assert_eq!(s.console_socket(1), Some(s.dir.join("node2.serial")));
        assert_eq!(s.agent_socket(1), Some(s.dir.join("node2.agent")));
        s.console_sockets = false;
        assert_eq!(s.console_socket(1), None);
        assert_eq!(s.agent_socket(1), None);
    }
}
