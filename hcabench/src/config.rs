//! The cluster description: a small TOML file whose every field has a default, so that no
//! file is needed for a first run.
//!
//! ```toml
//! nodes = 4          # guests, 1..=64 (default 2)
//! memory_mib = 256   # RAM per guest (default 256)
//! vcpus = 1          # per guest (default 1)
//! backend = "auto"   # "auto", "qemu" or "kvm" (default "auto")
//! image_dir = "target/images"   # where images/build.py put the guest images
//! kernel = "6.12"    # the guests' kernel: a Debian version ("6.1", "6.12"), an image's
//!                    # name ("6.12.117+deb12-amd64"), or the path of a developer's kernel
//!                    # tree or install directory (built into an image when it changed).
//!                    # Default: the image `images/build.py` builds with no --kernel
//! kernel_args = ""   # appended to every guest's kernel command line, e.g.
//!                    # "earlyprintk=serial,ttyS0 initcall_debug" (default none)
//! packet_life_time = 18   # the subnet's PacketLifeTime, 4.096 us * 2^N, 0 to 30: what
//!                    # OpenSM's option of that name sets (default 18, OpenSM's). The
//!                    # kernel's ib_cm derives an RC connection's ACK timeout from it:
//!                    # about 2.1 s at 18, 268 ms at 14, and 134 ms at 13 or less (hcab0
//!                    # reports a CA ACK delay of 15, which ib_cm takes when it is longer).
//!                    # A lost packet stalls a connection that long: lower it for fault
//!                    # campaigns. (Connections made through ib_cm or rdma_cm; the DSM
//!                    # module and vbench set a 67 ms timeout of their own.)
//! device_memory_mib = 64   # host memory each HCA may hold for its guest's requests in
//!                    # flight (every WR's share, payload copies, gather records), 4 to
//!                    # 4096: at it the guest's send queues wait for completions, and the
//!                    # host's memory stays bounded whatever a guest posts (default 64;
//!                    # docs/hca-abi.md, "Bounds on what one guest makes the device hold")
//!
//! ethernet = true    # a virtio-net NIC in every guest, all on one Ethernet segment
//!                    # (cluster/src/ethernet.rs), for SoftRoCE (`rxe-up 10.77.0.N/24`
//!                    # in a guest) and TCP over Ethernet beside IPoIB; either backend
//!                    # (default false)
//!
//! sm = "fabric"     # who manages the subnet: "fabric" (its own SM and SA, default) or
//!                    # "guest": a subnet manager a user runs in a guest (Debian's
//!                    # opensm: packages = ["opensm"], then `opensm -B` in a node); the
//!                    # ports wait in INIT until it brings them up, its SA answers, and
//!                    # the switches forward by the tables it sets. One host only
//!                    # (no [[host]]); no [[partition]] (the SM's partitions.conf sets them)
//!
//! packages = ["fio", "jq"]   # Debian packages (with their dependencies) for the guests,
//!                    # beside python3, pyverbs and iproute2: on the shared userland disk
//!                    # (images/build.py --package), laid under /usr at boot (a read-only
//!                    # virtio disk under either backend). Default none
//!
//! faults = "plan.toml"          # a seeded fault plan for the fabric (see hca_model::faults)
//! capture = "fabric.pcap"        # every fabric packet to a pcap file
//! capture_format = "erf"         # "erf" (Wireshark decodes it) or "infiniband" (link type 247)
//!
//! [node_memory_mib]  # nodes with RAM of their own, in MiB: e.g. a storage target
//! node1 = 1024       # serving many hosts (each NVMe-oF host costs it about 3.3 MiB)
//!
//! [vfio]             # host PCI functions passed through (kvm backend, `vfio` feature)
//! node1 = "/sys/bus/pci/devices/0000:03:00.0"
//!
//! [[partition]]      # a partition beside the default one (every node is a full member
//! pkey = 0x8001      # of 0xffff): its P_Key, 0x0001 to 0x7ffe with or without the full
//! members = ["node1", "node2"]   # bit; full members, and limited ones (which talk to
//! limited = ["node3"]            # full members only). In a guest:
//!                    # `ip link add link ib0 name ib0.8001 type ipoib pkey 0x8001`
//!
//! [[switch]]         # a subnet of several switches (default: one switch every node is
//! name = "leaf1"     # on). The first runs the SM; a switch's nodes take its ports 1, 2,
//! nodes = ["node1", "node2"]     # ... in order, its links the ports after those. Once
//! [[switch]]         # one is named, every node must be on exactly one. A name is 1 to
//! name = "leaf2"     # 48 letters, digits, '-', '_' or '.': ibnetdiscover shows it, and
//! nodes = ["node3"]  # `hcabench link down leaf1 leaf2` takes it
//!
//! [[link]]           # an inter-switch link (two switches may have several); every switch
//! switches = ["leaf1", "leaf2"]  # must be linked to the first, directly or not. The SM
//!                    # programs min-hop forwarding tables over the links that are up
//!
//! [[host]]           # a cluster that spans hcabench hosts, one subnet across them
//! name = "a"         # (docs/guides/hosts.md): each host runs its `nodes` (numbered across
//! address = "10.0.0.1:7700"  # the hosts in order: a's node1..node4, b's node5..), listens
//! nodes = 4          # for the others at `address` (UDP), and is started with
//! [[host]]           # `hcabench up --config FILE --host NAME`. The first runs the SM. With
//! name = "b"         # no [[switch]], each host has a switch of its own named after it,
//! address = "10.0.0.2:7700"  # linked to the first's; with [[switch]] tables, each says
//! nodes = 4          # `host = "a"`. `nodes` above must be the hosts' sum
//! ssh = "me@machine-b"  # optional: `hcabench up --host a --start-others` starts b over
//!                    # ssh (`hcabench up --config FILE --host b` there, FILE at the same
//!                    # path), and `hcabench down --others` stops it
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cluster::{ClusterSpec, Image};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The KVM VMM where KVM can run a Linux guest, QEMU (TCG) otherwise.
    #[default]
    Auto,
    /// QEMU with TCG, one process per guest, the HCAs in the device server.
    Qemu,
    /// hcabench's own VMM: every guest and HCA in the daemon's process (needs real KVM).
    Kvm,
}

impl Backend {
    /// The backend this asks for; None for auto (see `cluster::backend::choose`).
    pub fn request(self) -> Option<cluster::Backend> {
        match self {
            Backend::Auto => None,
            Backend::Qemu => Some(cluster::Backend::Qemu),
            Backend::Kvm => Some(cluster::Backend::Kvm),
        }
    }
}

/// Who manages the subnet (`sm = ...`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SubnetManager {
    /// The fabric's own SM and SA.
    #[default]
    Fabric,
    /// A subnet manager a user runs in a guest (OpenSM).
    Guest,
}

/// How a capture frames its IB packets (see hca_model::capture).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CaptureFormat {
    /// pcap of ERF InfiniBand records (link type 197): Wireshark and tshark decode it.
    #[default]
    Erf,
    /// pcap of bare frames, LINKTYPE_INFINIBAND (247): for tools that know that link type
    /// (Wireshark's file reader does not).
    Infiniband,
}

impl CaptureFormat {
    pub fn model(self) -> hca_model::capture::CaptureFormat {
        match self {
            CaptureFormat::Erf => hca_model::capture::CaptureFormat::Erf,
            CaptureFormat::Infiniband => hca_model::capture::CaptureFormat::Infiniband,
        }
    }
}

/// The most guests a cluster has.
pub const MAX_NODES: usize = 64;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    pub nodes: usize,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub backend: Backend,
    pub image_dir: PathBuf,
    /// The guests' kernel (see the module docs); None: the default image.
    pub kernel: Option<String>,
    /// Appended to every guest's kernel command line.
    pub kernel_args: String,
    /// The subnet's PacketLifeTime (see the module docs).
    pub packet_life_time: u8,
    /// What each HCA may hold for requests in flight, MiB (see the module docs).
    pub device_memory_mib: u64,
    /// A fault plan (TOML) to run the fabric under.
    pub faults: Option<PathBuf>,
    /// A pcap file that gets every fabric packet.
    pub capture: Option<PathBuf>,
    pub capture_format: CaptureFormat,
    /// Node name -> its RAM in MiB, instead of `memory_mib`.
    pub node_memory_mib: BTreeMap<String, u64>,
    /// Node name -> sysfs path of a host PCI function (bound to vfio-pci) that the node's
    /// guest gets next to its emulated HCA.
    pub vfio: BTreeMap<String, PathBuf>,
    /// Partitions beside the default (`[[partition]]`).
    pub partition: Vec<PartitionConfig>,
    /// The subnet's switches (`[[switch]]`); none: one switch every node is on.
    pub switch: Vec<SwitchConfig>,
    /// Inter-switch links (`[[link]]`).
    pub link: Vec<LinkConfig>,
    /// The hosts the cluster spans (`[[host]]`); none: this host alone.
    pub host: Vec<HostConfig>,
    /// Which of the hosts this is: set by `hcabench up --host NAME`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host: Option<String>,
    /// A NIC in every guest, on one Ethernet segment (see the module docs).
    pub ethernet: bool,
    /// Who manages the subnet (see the module docs).
    pub sm: SubnetManager,
    /// Debian packages for the guests' shared userland disk (see the module docs).
    pub packages: Vec<String>,
    /// The userland disk the guests attach instead of the image's: set by `hcabench up`
    /// once it built the disk `packages` asks for, so that the daemon boots that one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub userland: Option<PathBuf>,
}

/// One `[[partition]]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct PartitionConfig {
    pub pkey: u16,
    pub members: Vec<String>,
    pub limited: Vec<String>,
}

impl PartitionConfig {
    /// The partition as the launcher takes it.
    fn spec(&self) -> cluster::PartitionSpec {
        cluster::PartitionSpec {
            pkey: self.pkey,
            members: self.members.clone(),
            limited: self.limited.clone(),
        }
    }
}

/// One `[[switch]]`: its name and its nodes, on its ports 1, 2, ... in order.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct SwitchConfig {
    pub name: String,
    pub nodes: Vec<String>,
    /// The host it is on, in a cluster that spans hosts (`[[host]]`).
    pub host: String,
}

/// One `[[host]]`: its name, its address for the other hosts, how many nodes it runs,
/// and where ssh reaches it (for `hcabench up --start-others` on another host).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub name: String,
    pub address: std::net::SocketAddr,
    pub nodes: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
}

/// One `[[link]]`: the names of the two switches it joins.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    #[serde(deserialize_with = "two_switches")]
    pub switches: [String; 2],
}

/// `switches = [A, B]`, two names exactly (serde's own arrays take the first two of
/// more, and say nothing).
fn two_switches<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[String; 2], D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    <[String; 2]>::try_from(names).map_err(|names| {
        serde::de::Error::custom(format!(
            "a link joins two switches, not {}: {names:?}",
            names.len()
        ))
    })
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            memory_mib: 256,
            vcpus: 1,
            backend: Backend::Auto,
            image_dir: PathBuf::from("target/images"),
            kernel: None,
            kernel_args: String::new(),
            packet_life_time: hca_model::sa::DEFAULT_PACKET_LIFE,
            device_memory_mib: (hca_model::abi::MAX_IN_FLIGHT_BYTES >> 20) as u64,
            faults: None,
            capture: None,
            capture_format: CaptureFormat::Erf,
            node_memory_mib: BTreeMap::new(),
            vfio: BTreeMap::new(),
            partition: Vec::new(),
            switch: Vec::new(),
            link: Vec::new(),
            host: Vec::new(),
            this_host: None,
            ethernet: false,
            sm: SubnetManager::Fabric,
            packages: Vec::new(),
            userland: None,
        }
    }
}

/// A cluster file that cannot be used, with what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, or not the cluster file's fields.
    #[error("{origin}: {source}")]
    Toml {
        origin: String,
        source: toml::de::Error,
    },
    #[error("{origin}: {source}")]
    Invalid { origin: String, source: Invalid },
}

/// A setting of a cluster file that is out of range, names no node, or does not go with
/// the backend.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("nodes = {0} (must be 1 to {MAX_NODES})")]
    Nodes(usize),
    // Below 128 MiB a guest runs out of memory unpacking its initramfs (about 57 MB, held
    // twice until the archive is freed) before its init runs.
    #[error(
        "{what} = {mib} (must be 128 to 16384: a guest unpacks its 57 MB initramfs into RAM \
         as it boots)"
    )]
    Memory { what: String, mib: u64 },
    #[error("vcpus = {0} (must be 1 to 16)")]
    Vcpus(u32),
    /// `table` names `name`, which is not one of the `nodes`.
    #[error("{table}: no node {name:?} (the nodes are node1 to node{nodes})")]
    NoNode {
        table: String,
        name: String,
        nodes: usize,
    },
    #[error("vfio: passthrough needs the kvm backend, not qemu")]
    VfioOnQemu,
    #[error("packages: {0:?} is not a Debian package name")]
    Package(String),
    #[error(
        "[[host]] {host}: ssh = {dest:?} (one ssh destination, e.g. \"me@machine\", no \
         spaces: the command it runs is $HCABENCH_SSH)"
    )]
    Ssh { host: String, dest: String },
    #[error("device_memory_mib = {mib} (must be {least} to 4096)")]
    DeviceMemory { mib: u64, least: u64 },
    #[error(
        "packet_life_time = {0} (must be 0 to {max}: ib_cm adds one for a QP's 5-bit ACK \
         timeout)",
        max = hca_model::sa::MAX_PACKET_LIFE
    )]
    PacketLife(u8),
    #[error(transparent)]
    Spec(#[from] cluster::SpecError),
    /// (Boxed: the hosts' errors name several things, and a config error is returned by
    /// value everywhere.)
    #[error(transparent)]
    Hosts(Box<cluster::HostsError>),
    #[error("partition: {0}")]
    Partition(#[from] hca_model::partition::PartitionError),
    #[error("sm = \"guest\": {0}")]
    GuestSm(&'static str),
}

impl From<cluster::HostsError> for Invalid {
    fn from(e: cluster::HostsError) -> Self {
        Invalid::Hosts(Box::new(e))
    }
}

impl ClusterConfig {
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let c: ClusterConfig = toml::from_str(text).map_err(|source| ConfigError::Toml {
            origin: origin.to_string(),
            source,
        })?;
        c.validate().map_err(|source| ConfigError::Invalid {
            origin: origin.to_string(),
            source,
        })?;
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return Err(Invalid::Nodes(self.nodes));
        }
        let memory = |what: &str, mib: u64| {
            if (128..=16384).contains(&mib) {
                Ok(())
            } else {
                Err(Invalid::Memory {
                    what: what.to_string(),
                    mib,
                })
            }
        };
        memory("memory_mib", self.memory_mib)?;
        if !(1..=16).contains(&self.vcpus) {
            return Err(Invalid::Vcpus(self.vcpus));
        }
        let no_node = |table: &str, name: &str| Invalid::NoNode {
            table: table.to_string(),
            name: name.to_string(),
            nodes: self.nodes,
        };
        for name in self.vfio.keys() {
            if !self.is_node(name) {
                return Err(no_node("vfio", name));
            }
        }
        for (name, &mib) in &self.node_memory_mib {
            if !self.is_node(name) {
                return Err(no_node("node_memory_mib", name));
            }
            memory(&format!("node_memory_mib: {name}"), mib)?;
        }
        if !self.vfio.is_empty() && self.backend == Backend::Qemu {
            return Err(Invalid::VfioOnQemu);
        }
        if let Some(bad) = (self.packages.iter()).find(|p| !is_debian_package_name(p)) {
            return Err(Invalid::Package(bad.clone()));
        }
        for h in &self.host {
            if let Some(dest) = (h.ssh.as_ref())
                .filter(|d| d.is_empty() || d.starts_with('-') || d.contains(char::is_whitespace))
            {
                return Err(Invalid::Ssh {
                    host: h.name.clone(),
                    dest: dest.clone(),
                });
            }
        }
        let least = (hca_model::abi::MIN_IN_FLIGHT_BYTES >> 20) as u64;
        if !(least..=4096).contains(&self.device_memory_mib) {
            return Err(Invalid::DeviceMemory {
                mib: self.device_memory_mib,
                least,
            });
        }
        if self.packet_life_time > hca_model::sa::MAX_PACKET_LIFE {
            return Err(Invalid::PacketLife(self.packet_life_time));
        }
        for p in &self.partition {
            for name in p.members.iter().chain(&p.limited) {
                if !self.is_node(name) {
                    return Err(no_node(&format!("partition {:#06x}", p.pkey), name));
                }
            }
        }
        let parts = (self.partition.iter())
            .map(|p| p.spec().with_lids(self.nodes))
            .collect::<Result<Vec<_>, _>>()?;
        hca_model::partition::tables(&parts)?;
        self.hosts()?.topology(&self.topology(), self.nodes)?;
        if self.sm == SubnetManager::Guest {
            if !self.host.is_empty() {
                return Err(Invalid::GuestSm(
                    "a subnet manager in a guest manages the switches of one host (no \
                     [[host]])",
                ));
            }
            if !self.partition.is_empty() {
                return Err(Invalid::GuestSm(
                    "with sm = \"guest\" the partitions are the SM's to set (OpenSM's \
                     partitions.conf), not [[partition]]'s",
                ));
            }
        }
        Ok(())
    }

    /// The `[[host]]` tables as the launcher takes them, with this host's index (the
    /// first when `this_host` is not said).
    pub fn hosts(&self) -> Result<cluster::HostsSpec, cluster::HostsError> {
        let mut h = cluster::HostsSpec {
            hosts: (self.host.iter())
                .map(|h| cluster::HostSpec {
                    name: h.name.clone(),
                    address: h.address,
                    nodes: h.nodes,
                })
                .collect(),
            here: 0,
        };
        if let Some(name) = &self.this_host {
            h.here = h.index_of(name)?;
        }
        Ok(h)
    }

    /// The `[[switch]]` and `[[link]]` tables as the launcher takes them.
    fn topology(&self) -> cluster::TopologySpec {
        cluster::TopologySpec {
            switches: (self.switch.iter())
                .map(|s| cluster::SwitchSpec {
                    name: s.name.clone(),
                    nodes: s.nodes.clone(),
                    host: s.host.clone(),
                })
                .collect(),
            links: self.link.iter().map(|l| l.switches.clone()).collect(),
        }
    }

    /// The guest image this file boots (`kernel` under `image_dir`) if it is built: a
    /// developer's kernel by path never is (see [`ClusterConfig::image`]).
    pub fn find_image(&self) -> Result<Image, cluster::ImageError> {
        let mut image = Image::resolve(&self.image_dir, self.kernel.as_deref())?;
        if let Some(disk) = &self.userland {
            if !disk.exists() {
                return Err(cluster::ImageError::Incomplete {
                    version: image.name,
                    missing: disk.clone(),
                });
            }
            image.userland = Some(disk.clone());
        }
        Ok(image)
    }

    /// The guest image this file boots, built first with `images/build.py` (progress on
    /// stderr) where `kernel` is a developer's kernel by path (always checked: the tree may
    /// have been rebuilt) or a Debian kernel with no image yet.
    pub fn image(&self) -> Result<Image, cluster::ImageError> {
        match self.kernel.as_deref() {
            Some(k) if cluster::is_kernel_path(k) => {
                let path = std::path::absolute(k).unwrap_or_else(|_| PathBuf::from(k));
                Image::build(&self.image_dir, &path.to_string_lossy())
            }
            Some(k) => match self.find_image() {
                Err(cluster::ImageError::NoKernel { .. }) => Image::build(&self.image_dir, k),
                found => found,
            },
            None => self.find_image(),
        }
    }

    /// [`ClusterConfig::image`], then `kernel` pinned to the image's name, so that what
    /// boots later (the daemon) boots exactly that image without building again.
    pub fn build_image(&mut self) -> Result<Image, cluster::ImageError> {
        let mut image = self.image()?;
        if self.kernel.is_some() {
            self.kernel = Some(image.name.clone());
        }
        // The user's packages: their disk, built once per set of names (and again when
        // Debian's versions change), pinned for the daemon.
        if !self.packages.is_empty() {
            let disk = Image::build_userland(&self.image_dir, &self.packages)?;
            image.userland = Some(disk.clone());
            self.userland = Some(disk);
        }
        Ok(image)
    }

    /// The RAM of the node called `name`, in MiB.
    pub fn memory_mib_of(&self, name: &str) -> u64 {
        let own = self.node_memory_mib.get(name);
        own.copied().unwrap_or(self.memory_mib)
    }

    /// Whether `name` is one of the nodes' names (node1 to nodeN).
    fn is_node(&self, name: &str) -> bool {
        ClusterSpec::node_index(name, self.nodes).is_some()
    }

    /// A cluster of `nodes` guests as this file describes each one (RAM, vCPUs, kernel
    /// arguments) on a subnet as it describes it, under `backend`, with its run files in
    /// `dir`. A bench that boots fewer nodes than the file has leaves out the others' RAM.
    pub fn spec(
        &self,
        backend: cluster::Backend,
        image: Image,
        dir: PathBuf,
        nodes: usize,
    ) -> ClusterSpec {
        ClusterSpec {
            ram_mib: self.memory_mib,
            ram_mib_of: (self.node_memory_mib.iter())
                .filter(|(name, _)| ClusterSpec::node_index(name, nodes).is_some())
                .map(|(name, &mib)| (name.clone(), mib))
                .collect(),
            vcpus: self.vcpus,
            kernel_args: self.kernel_args.clone(),
            packet_life: self.packet_life_time,
            guest_sm: self.sm == SubnetManager::Guest,
            device_memory_mib: self.device_memory_mib,
            link: self.ethernet,
            // (Members past a bench's `nodes` are left out, as their RAM is.)
            partitions: (self.partition.iter())
                .map(|p| {
                    let within = |names: &[String]| -> Vec<String> {
                        (names.iter())
                            .filter(|n| ClusterSpec::node_index(n, nodes).is_some())
                            .cloned()
                            .collect()
                    };
                    cluster::PartitionSpec {
                        pkey: p.pkey,
                        members: within(&p.members),
                        limited: within(&p.limited),
                    }
                })
                .collect(),
            // (A bench's nodes past its count are left out, as their RAM is.)
            topology: self.topology().within(nodes),
            hosts: self.hosts().unwrap_or_default(),
            ..ClusterSpec::new(backend, image, dir, nodes)
        }
    }
}

/// A Debian package name: lower-case letters, digits and `+-.`, two or more, starting
/// with a letter or digit (Debian Policy 5.6.1).
fn is_debian_package_name(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && (name.chars()).all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image whose files are never opened: for specs built from a file.
    fn test_image() -> Image {
        Image {
            kernel_version: "k".into(),
            name: "k".into(),
            vmlinux: "v".into(),
            bzimage: "b".into(),
            initramfs: "i".into(),
            userland: None,
        }
    }

    #[test]
    fn test_every_field_has_a_default() {
        assert_eq!(
            ClusterConfig::parse("", "empty").unwrap(),
            ClusterConfig::default()
        );
        let c = ClusterConfig::parse("nodes = 4\nbackend = \"qemu\"", "x").unwrap();
        assert_eq!((c.nodes, c.backend, c.memory_mib), (4, Backend::Qemu, 256));
    }

    #[test]
    fn test_the_kernel_is_the_default_image_unless_the_file_names_one() {
        assert_eq!(ClusterConfig::default().kernel, None);
        let c = ClusterConfig::parse("kernel = \"6.12\"", "x").unwrap();
        assert_eq!(c.kernel.as_deref(), Some("6.12"));
        // An image of that version is looked for where image_dir says.
        let dir = std::env::temp_dir().join(format!("hcab-cfg-kernel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = ClusterConfig {
            image_dir: dir.clone(),
            ..c
        };
        let e = c.find_image().unwrap_err().to_string();
        assert!(e.contains("no guest image of kernel 6.12"), "{e}");
    }

    #[test]
    fn test_bad_files_say_what_is_wrong() {
        let e = ClusterConfig::parse("nodes = 65", "c.toml").unwrap_err();
        assert!(
            e.to_string().contains("c.toml")
                && e.to_string().contains("nodes = 65 (must be 1 to 64)"),
            "{e}"
        );
        let e = ClusterConfig::parse("node = 4", "c.toml").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = ClusterConfig::parse("backend = \"xen\"", "c.toml").unwrap_err();
        assert!(e.to_string().contains("xen"), "{e}");
        let e = ClusterConfig::parse("[vfio]\nnode3 = \"/sys/x\"", "c.toml").unwrap_err();
        assert!(e.to_string().contains("no node \"node3\""), "{e}");
        let e =
            ClusterConfig::parse("backend = \"qemu\"\n[vfio]\nnode1 = \"/x\"", "c").unwrap_err();
        assert!(e.to_string().contains("needs the kvm backend"), "{e}");
        let e = ClusterConfig::parse("packages = [\"fio\", \"x; rm -rf /\"]", "c").unwrap_err();
        assert!(e.to_string().contains("not a Debian package name"), "{e}");
        let c = ClusterConfig::parse("backend = \"kvm\"\npackages = [\"fio\"]", "c").unwrap();
        assert_eq!(c.packages, ["fio"], "the VMM's guests get the disk too");
        let c = ClusterConfig::parse("packages = [\"fio\", \"libc6\", \"g++-12\"]", "c").unwrap();
        assert_eq!(c.packages, ["fio", "libc6", "g++-12"]);
        let e = ClusterConfig::parse("packet_life_time = 31", "c.toml").unwrap_err();
        assert!(
            e.to_string()
                .contains("packet_life_time = 31 (must be 0 to 30"),
            "{e}"
        );
        let e = ClusterConfig::parse("device_memory_mib = 2", "c.toml").unwrap_err();
        assert!(
            e.to_string()
                .contains("device_memory_mib = 2 (must be 4 to 4096)"),
            "{e}"
        );
        let c = ClusterConfig::parse("device_memory_mib = 16", "c.toml").unwrap();
        let image = test_image();
        let spec = c.spec(cluster::Backend::Qemu, image, "/tmp/x".into(), 2);
        assert_eq!(spec.in_flight_budget(), 16 << 20);
        assert!(!spec.link, "no NICs unless asked for");
    }

    #[test]
    fn test_a_guest_sm_takes_one_hosts_switches_and_sets_the_partitions_itself() {
        let c = ClusterConfig::parse("nodes = 3\nsm = \"guest\"", "c.toml").unwrap();
        let spec = c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 3);
        assert!(spec.guest_sm);
        let back = toml::to_string(&c).unwrap();
        assert_eq!(ClusterConfig::parse(&back, "again").unwrap(), c);
        let dflt = ClusterConfig::parse("nodes = 3", "c.toml").unwrap();
        assert_eq!(dflt.sm, SubnetManager::Fabric);
        let e = ClusterConfig::parse("sm = \"opensm\"", "c.toml").unwrap_err();
        assert!(e.to_string().contains("opensm"), "{e}");
        let e = ClusterConfig::parse(
            "nodes = 2\nsm = \"guest\"\n[[partition]]\npkey = 0x8001\nmembers = [\"node1\"]",
            "c.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("partitions.conf"), "{e}");
        let two = "nodes = 2\nsm = \"guest\"\n[[switch]]\nname = \"a\"\nnodes = [\"node1\"]\n\
                   [[switch]]\nname = \"b\"\nnodes = [\"node2\"]\n[[link]]\nswitches = [\"a\", \"b\"]\n";
        let c = ClusterConfig::parse(two, "c.toml").unwrap();
        assert!(
            c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 2)
                .guest_sm
        );
        let hosts = "nodes = 2\nsm = \"guest\"\n\
                     [[host]]\nname = \"h\"\naddress = \"127.0.0.1:7700\"\nnodes = 1\n\
                     [[host]]\nname = \"i\"\naddress = \"127.0.0.2:7700\"\nnodes = 1\n";
        let e = ClusterConfig::parse(hosts, "c.toml").unwrap_err();
        assert!(e.to_string().contains("switches of one host"), "{e}");
    }

    #[test]
    fn test_ethernet_gives_every_guest_a_nic_on_one_segment() {
        let c = ClusterConfig::parse("nodes = 5\nethernet = true", "c.toml").unwrap();
        let spec = c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 5);
        assert!(spec.link && spec.nodes == 5);
        let back = toml::to_string(&c).unwrap();
        assert_eq!(ClusterConfig::parse(&back, "again").unwrap(), c);
    }

    #[test]
    fn test_partitions_name_nodes_and_valid_p_keys() {
        let text = "nodes = 3\n[[partition]]\npkey = 0x8001\nmembers = [\"node1\", \"node2\"]\n\
                    limited = [\"node3\"]\n";
        let c = ClusterConfig::parse(text, "x").unwrap();
        let dir = PathBuf::from("/tmp/x");
        let image = test_image();
        let spec = c.spec(cluster::Backend::Qemu, image.clone(), dir.clone(), 3);
        assert_eq!(
            spec.partitions,
            [cluster::PartitionSpec {
                pkey: 0x8001,
                members: vec!["node1".into(), "node2".into()],
                limited: vec!["node3".into()],
            }]
        );
        // A bench on fewer nodes leaves the others out.
        let two = c.spec(cluster::Backend::Qemu, image, dir, 2);
        assert!(two.partitions[0].limited.is_empty());
        let e = ClusterConfig::parse("[[partition]]\npkey = 1\nmembers = [\"node5\"]", "c")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("partition 0x0001: no node \"node5\""),
            "{e}"
        );
        let e = ClusterConfig::parse("[[partition]]\npkey = 0x7fff\nmembers = [\"node1\"]", "c")
            .unwrap_err();
        assert!(e.to_string().contains("the default's"), "{e}");
        let twice = "[[partition]]\npkey = 3\n[[partition]]\npkey = 0x8003\n";
        let e = ClusterConfig::parse(twice, "c").unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    /// The module docs' example: node1 and node2 on leaf1, node3 on leaf2, one link.
    const TWO_LEAVES: &str = "nodes = 3\n\
        [[switch]]\nname = \"leaf1\"\nnodes = [\"node1\", \"node2\"]\n\
        [[switch]]\nname = \"leaf2\"\nnodes = [\"node3\"]\n\
        [[link]]\nswitches = [\"leaf1\", \"leaf2\"]\n";

    #[test]
    fn test_switches_and_links_cable_the_subnet_the_launcher_boots() {
        let c = ClusterConfig::parse(TWO_LEAVES, "x").unwrap();
        let back = ClusterConfig::parse(&toml::to_string(&c).unwrap(), "written").unwrap();
        assert_eq!(back, c, "it writes and reads back unchanged");
        let spec = c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 3);
        let leaf = |name: &str, nodes: &[&str]| cluster::SwitchSpec {
            name: name.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            host: String::new(),
        };
        assert_eq!(
            spec.topology,
            cluster::TopologySpec {
                switches: vec![
                    leaf("leaf1", &["node1", "node2"]),
                    leaf("leaf2", &["node3"])
                ],
                links: vec![["leaf1".into(), "leaf2".into()]],
            }
        );
        // A bench on fewer nodes leaves the others off their switches.
        let two = c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 2);
        assert_eq!(two.topology.switches[1], leaf("leaf2", &[]));
        assert!(ClusterConfig::default()
            .spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 2)
            .topology
            .is_single());
    }

    const TWO_HOSTS: &str = "nodes = 3\n\
        [[host]]\nname = \"a\"\naddress = \"10.0.0.1:7700\"\nnodes = 2\n\
        [[host]]\nname = \"b\"\naddress = \"10.0.0.2:7700\"\nnodes = 1\n";

    #[test]
    fn test_hosts_split_the_nodes_and_each_boots_its_own() {
        let mut c = ClusterConfig::parse(TWO_HOSTS, "x").unwrap();
        let back = ClusterConfig::parse(&toml::to_string(&c).unwrap(), "written").unwrap();
        assert_eq!(back, c, "it writes and reads back unchanged");
        c.this_host = Some("b".into());
        let spec = c.spec(cluster::Backend::Qemu, test_image(), "/tmp/x".into(), 3);
        assert_eq!((spec.hosts.here, spec.local_nodes()), (1, 2..3));
        assert_eq!(spec.hosts.addresses()[1], "10.0.0.2:7700".parse().unwrap());
        // Written for the daemon, it says which host it is.
        let back = ClusterConfig::parse(&toml::to_string(&c).unwrap(), "written").unwrap();
        assert_eq!(back.this_host.as_deref(), Some("b"));
        c.this_host = Some("c".into());
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("no host \"c\""));
        // The nodes must add up; an address is not a word.
        let bad = TWO_HOSTS.replace("nodes = 3", "nodes = 4");
        let e = ClusterConfig::parse(&bad, "x").unwrap_err().to_string();
        assert!(e.contains("add up to 3, the cluster has 4"), "{e}");
        let bad = TWO_HOSTS.replace("10.0.0.2:7700", "b.example");
        assert!(ClusterConfig::parse(&bad, "x").is_err());
        // Where ssh reaches a host: kept, and one destination (not an option, no spaces).
        let ssh = format!("{TWO_HOSTS}ssh = \"me@b\"\n");
        let c = ClusterConfig::parse(&ssh, "x").unwrap();
        assert_eq!(c.host[1].ssh.as_deref(), Some("me@b"));
        let back = ClusterConfig::parse(&toml::to_string(&c).unwrap(), "written").unwrap();
        assert_eq!(back, c);
        for dest in ["", "-oProxyCommand=x", "me@b rm"] {
            let bad = format!("{TWO_HOSTS}ssh = {dest:?}\n");
            let e = ClusterConfig::parse(&bad, "x").unwrap_err().to_string();
            assert!(e.contains("[[host]] b: ssh ="), "{dest:?}: {e}");
        }
    }

    #[test]
    fn test_a_cabling_that_cannot_be_is_refused_in_the_files_names() {
        let bad = [
            (
                TWO_LEAVES.replace("\"node3\"]", "\"node3\", \"node4\"]"),
                "switch \"leaf2\": node4 is not a node (the nodes are node1 to node3)",
            ),
            (
                TWO_LEAVES.replace("[\"node3\"]", "[\"node3\", \"node1\"]"),
                "node1 is on two switches, \"leaf1\" and \"leaf2\"",
            ),
            (
                TWO_LEAVES.replace("[\"node3\"]", "[]"),
                "node3 is on no switch",
            ),
            (
                TWO_LEAVES.replace("[\"leaf1\", \"leaf2\"]", "[\"leaf1\", \"spine\"]"),
                "[[link]] 1: no switch \"spine\" (the switches are leaf1, leaf2)",
            ),
            (
                TWO_LEAVES.replace("[\"leaf1\", \"leaf2\"]", "[\"leaf2\", \"leaf2\"]"),
                "[[link]] 1 joins switch \"leaf2\" to itself",
            ),
            (
                TWO_LEAVES.replace("[[link]]\nswitches = [\"leaf1\", \"leaf2\"]\n", ""),
                "switch \"leaf2\" is not linked to \"leaf1\", the first switch",
            ),
            (
                TWO_LEAVES.replace("leaf2\"\nnodes", "leaf 2\"\nnodes"),
                "switch name \"leaf 2\": want 1 to 48 letters",
            ),
            (
                "[[link]]\nswitches = [\"a\", \"b\"]\n".to_string(),
                "[[link]] 1: no switch \"a\" (the switches are none",
            ),
        ];
        for (text, says) in bad {
            let e = ClusterConfig::parse(&text, "c.toml")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("c.toml: ") && e.contains(says), "{says}: {e}");
        }
        // A link joins two switches, no more and no fewer.
        let three = TWO_LEAVES.replace("\"leaf2\"]", "\"leaf2\", \"leaf1\"]");
        let e = ClusterConfig::parse(&three, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a link joins two switches, not 3"), "{e}");
        let e = ClusterConfig::parse(&format!("{TWO_LEAVES}[[link]]\n"), "c").unwrap_err();
        assert!(e.to_string().contains("missing field `switches`"), "{e}");
        let e = ClusterConfig::parse(&format!("{TWO_LEAVES}[[link]]\nswitch = []\n"), "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `switch`"), "{e}");
    }

    #[test]
    fn test_a_node_table_gives_one_node_its_own_memory() {
        let text = "nodes = 3\nmemory_mib = 256\n[node_memory_mib]\nnode1 = 1024\n";
        let c = ClusterConfig::parse(text, "x").unwrap();
        let back = ClusterConfig::parse(&toml::to_string(&c).unwrap(), "written").unwrap();
        assert_eq!(back, c, "it writes and reads back unchanged");
        let image = cluster::Image {
            kernel_version: "6.1".into(),
            name: "6.1".into(),
            vmlinux: "vmlinux".into(),
            bzimage: "bzImage".into(),
            initramfs: "initramfs".into(),
            userland: None,
        };
        let spec = c.spec(cluster::Backend::Qemu, image, "/tmp/x".into(), 3);
        let ram: Vec<u64> = (0..3).map(|i| spec.node_ram_mib(i)).collect();
        assert_eq!(ram, [1024, 256, 256]);
        // A bench's own count of nodes leaves out the file's others.
        let mut c = c;
        c.node_memory_mib.insert("node3".into(), 512);
        let spec = c.spec(cluster::Backend::Qemu, spec.image, "/tmp/x".into(), 2);
        assert_eq!(spec.ram_mib_of.len(), 1);
        // A node that is not there, or a size out of range, is refused.
        let bad = [
            (
                "nodes = 2\n[node_memory_mib]\nnode3 = 512",
                "no node \"node3\"",
            ),
            ("[node_memory_mib]\nnode01 = 512", "no node \"node01\""),
            (
                "[node_memory_mib]\nnode1 = 96",
                "node1 = 96 (must be 128 to 16384",
            ),
        ];
        for (text, says) in bad {
            let e = ClusterConfig::parse(text, "c").unwrap_err();
            assert!(
                e.to_string().contains(&format!("node_memory_mib: {says}")),
                "{e}"
            );
        }
    }

    #[test]
    fn test_vfio_table_round_trips() {
        let c = ClusterConfig::parse("[vfio]\nnode2 = \"/sys/bus/pci/devices/0000:03:00.0\"", "x")
            .unwrap();
        assert_eq!(
            c.vfio["node2"],
            PathBuf::from("/sys/bus/pci/devices/0000:03:00.0")
        );
        let text = toml::to_string(&c).unwrap();
        assert_eq!(ClusterConfig::parse(&text, "again").unwrap(), c);
    }
}
