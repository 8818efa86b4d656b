//! `hcabench`: boots clusters of Linux guests with emulated InfiniBand HCAs and runs jobs on
//! them.
//!
//! # Modules
//!
//! - This file: the command line (clap) and each command's top.
//! - `error`: the one error type the commands return, and what it tells the user to do.
//! - `config` (in `lib.rs`, shared with the fuzz harness): the TOML cluster file.
//! - `daemon`: `up`'s background process (boots through the launcher, carries out kills,
//!   notes stopped guests); `rundir`: where a running cluster's files are.
//! - `session`: `run` and `bench` (the cluster file on the launcher, capture, fault plan,
//!   node kills); `faultrun`: the plan and capture on the fabric, the log, the report.
//! - `control`: control.sock, for `fault`, `partition`, `link`, `fabric` and `counters`
//!   into the daemon; `console`: `hcabench console`.
//! - `exec` and `copy`: `exec` and `cp` over each guest's ttyS1 (`tar`, `sha256` and
//!   `base64` for the copies).
//! - `launch`: the other hosts of a cluster that spans hosts, started and stopped over ssh.
//! - `bench`, `dsmrun`, `apps_bench`, `ipoib_bench`, `nfs_bench`, `perftest_bench`,
//!   `stack_bench`: the benchmarks and the DSM's runs; `mpirun`: an MPI job across the guests.
//!
//! Tested by `tests/cli.rs` and `tests/exec_cp.rs` against real guests, and
//! `tests/kernel.rs` with a developer's own kernel (`--kernel DIR`).

mod apps_bench;
mod base64;
mod bench;
mod console;
mod control;
mod copy;
mod daemon;
mod dsmrun;
mod error;
mod exec;
mod faultrun;
mod ipoib_bench;
mod launch;
mod mpirun;
mod nfs_bench;
mod perftest_bench;
mod rundir;
mod session;
mod sha256;
mod stack_bench;
mod tar;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use cluster::console_protocol::{INIT, IPOIB, PROBE, READY};
use cluster::node::complete_lines;
use cluster::Backend;

use error::{BootWait, Error, UsageError};
use hcabench::config::{self, ClusterConfig};
use rundir::{pid_alive, ClusterState, RunDir};

/// Boots clusters of Linux guests, each with an emulated InfiniBand HCA on one fabric, so
/// that kernel RDMA code runs unmodified without InfiniBand hardware.
///
/// A cluster is described by a TOML file (--config) whose every field has a default:
/// nodes (2), memory_mib (256), vcpus (1), backend ("auto"), image_dir ("target/images"),
/// packet_life_time (18, as OpenSM's: RC connections wait about 2.1 s for a lost packet),
/// kernel (the default image; `--kernel 6.12` or a developer's tree: see `up --help`).
/// Build the guest image first with `python3 images/build.py`.
#[derive(Parser)]
#[command(name = "hcabench", version)]
struct Cli {
    /// Where the cluster's sockets and console logs live
    /// [default: $XDG_RUNTIME_DIR/hcabench or /tmp/hcabench-UID; env HCABENCH_RUN_DIR]
    #[arg(long, global = true)]
    run_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot a cluster in the background and wait until every guest is ready
    Up(UpArgs),
    /// Stop the cluster: guests, device server, run files
    Down {
        /// On a cluster that spans hosts, stop the other hosts' too, over ssh (`hcabench
        /// down` on each [[host]] with an `ssh` destination)
        #[arg(long)]
        others: bool,
        /// With --others where this host has no cluster up (it failed to start, or was
        /// stopped already): the cluster file that names the other hosts
        #[arg(long, requires = "others")]
        config: Option<PathBuf>,
        /// With --config: which of its [[host]] tables is this host (not stopped over ssh)
        #[arg(long, requires = "config")]
        host: Option<String>,
    },
    /// Show the cluster's nodes, their LIDs, QEMU processes and console logs
    Status,
    /// Show the fabric's subnet: its switches (name, LID, the nodes on their ports, whether
    /// the SM reaches each now) and the links between them, up or down; the subnet
    /// administrator's multicast groups (MGID, MLID, Q_Key) and which nodes joined them
    /// (IPoIB joins its broadcast group on every node), the partitions and their members,
    /// and how many service records and trap subscriptions it holds
    Fabric,
    /// Show the nodes' port counters, as the device counts them: packets and octets each
    /// way, resends, NAKs, drops, discards, P_Key violations
    ///
    /// A row per node of the counters a fault run moves; with NODE, every counter of that
    /// node, one per line. Guests read the same through their driver:
    /// /sys/class/infiniband/hcab0/ports/1/hw_counters/ and `rdma statistic`, and IBA's
    /// PortCounters in .../ports/1/counters/. These count from boot and never go back; a
    /// PMA reset (`pma-query -r LID` in a guest) changes only what counters/ shows.
    Counters {
        /// One node, e.g. node2: all its counters
        node: Option<String>,
    },
    /// Attach to a guest's serial console (Ctrl-] detaches)
    Console {
        /// The node, e.g. node2
        node: String,
    },
    Exec(exec::ExecArgs),
    Cp(copy::CpArgs),
    Mpirun(mpirun::MpirunArgs),
    /// Inject a fault into the running cluster, now
    ///
    /// Actions on NODE's link (both directions): link-down, link-up; drop P, duplicate P,
    /// reorder P, corrupt P (probabilities per packet, 0 clears); delay US [JITTER_US]
    /// (these five in any number in one call, e.g. `drop 0.01 reorder 0.05`); clear (back
    /// to the cluster's plan). `kill` stops NODE's guest and takes its HCA off
    /// the fabric, so its peers' work requests end in error completions. `fatal` gives
    /// NODE's adapter a catastrophic error: its port goes down and its work is flushed;
    /// hca_ib raises IB_EVENT_DEVICE_FATAL, its consumers tear down, and the driver resets
    /// the function and registers a new hcab0 (docs/guides/faults.md says what each ULP
    /// does then). `reset` resets NODE's adapter underneath its driver: it forgets every
    /// QP, CQ and EQ at once and flushes nothing; hca_ib notices within a second, completes
    /// its consumers' work in software and recovers as from `fatal`. `unplug` hot-unplugs
    /// NODE's HCA (PCI, through QEMU's monitor; the qemu backend only): the guest's kernel
    /// releases it, then its port leaves the fabric; `replug` plugs a new one into the
    /// slot, which the guest probes (ULPs come back as after `fatal`). Each change is
    /// logged in faults.jsonl next to the plan's decisions, and `hcabench down` reports
    /// it. Example: `hcabench fault node2 link-down`.
    Fault {
        /// The node, e.g. node2
        node: String,
        /// The action and its arguments
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        action: Vec<String>,
    },
    /// Change a partition of the running cluster, as an SM does: set PKEY's full and
    /// limited members (replacing what it had), or remove it
    ///
    /// Every port's P_Key table follows at once and the guests' drivers hear of it (a P_Key
    /// change event): an IPoIB child interface of that partition gets carrier on a node
    /// that joins it. QPs made before keep the P_Key they were made with. Example:
    /// `hcabench partition 0x8001 --members node1,node2 --limited node3`.
    Partition {
        /// The partition's P_Key, e.g. 0x8001 (the membership bit is each node's own)
        pkey: String,
        /// Full members, comma-separated node names
        #[arg(long, default_value = "")]
        members: String,
        /// Limited members (they talk to full members only)
        #[arg(long, default_value = "")]
        limited: String,
        /// Remove the partition instead
        #[arg(long, conflicts_with_all = ["members", "limited"])]
        remove: bool,
    },
    /// Cut a link between two switches of the running cluster, or restore it
    ///
    /// For a subnet of several switches ([[switch]] and [[link]] in the cluster file).
    /// `down` cuts the link as a pulled cable would: packets whose route crosses it are
    /// lost from then on. At the fabric's next tick (a millisecond) the SM sweeps: it
    /// programs min-hop forwarding tables over the links still up, so traffic goes round
    /// the cut where another path exists, and the ports it can no longer reach are
    /// reported out of service (trap 65) to the SA's subscribers; `up` restores the link,
    /// the SM sweeps again and reports them back in service (trap 64). The guests' own
    /// tools show it: ibnetdiscover, ibroute, ibtracert, iblinkinfo. `hcabench fabric`
    /// lists the switches and links, with the packets each carried and lost.
    ///
    /// `faults` puts a rule on the link, both ways, as `hcabench fault NODE` does on a
    /// node's link: --drop, --duplicate, --reorder, --corrupt (probabilities per packet, 0
    /// clears), --delay with an optional --jitter (microseconds; --delay alone sets the
    /// jitter to 0); the rates not given keep what the last `faults` set. It takes the
    /// place of the fault plan's per-packet rules for that link until `clear` (the plan's
    /// down windows still cut it). The decisions are logged in faults.jsonl as
    /// `switch-link1-up` (from the first switch the `[[link]]` names to the second) or
    /// `-down`. On a link between hosts, each host judges what comes into its own switch:
    /// give it on both hosts for both ways.
    /// Examples: `hcabench link down leaf1 leaf2`, `hcabench link faults leaf1 leaf2 --drop
    /// 0.01 --delay 200`.
    Link {
        /// down (cut it), up (restore it), faults (a rule on it), clear (back to the plan)
        #[arg(value_enum)]
        state: LinkState,
        /// One switch the link joins, by its name in the cluster file
        switch: String,
        /// The other switch it joins
        other: String,
        /// Which of the links joining the two, 1, 2, ... in the cluster file's order:
        /// needed only when several join them
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        n: Option<u32>,
        #[command(flatten)]
        faults: LinkFaultArgs,
    },
    /// Run a job: `probe` on the cluster (booting one if none is up), or a DSM application
    /// on a fresh cluster of its own
    ///
    /// DSM applications (static guest programs over the kernel DSM): sor, is, lu, tsp,
    /// nbody, nbodyw, water, barnes. Each node runs one process with --threads application
    /// threads; node 1 checks the result against a sequential run; the table shows each
    /// node's time, DSM faults, messages and page data.
    /// Example: `hcabench run sor --nodes 4 -- 258 1024 20` (arguments after `--` go to the
    /// application: sor ROWS COLS ITERS, is KEYS MAXKEY ITERS, lu N, tsp CITIES,
    /// nbody BODIES STEPS, nbodyw BODIES STEPS, water MOLECULES STEPS, barnes BODIES STEPS).
    Run {
        /// The job
        #[arg(value_enum)]
        app: dsmrun::Job,
        #[command(flatten)]
        up: UpArgs,
        /// DSM transport: the hcabench HCA, or SoftRoCE on 2 nodes
        #[arg(long, value_enum, default_value = "hca")]
        transport: dsmrun::Transport,
        /// Guest image directory (overrides the cluster file's image_dir)
        #[arg(long)]
        image_dir: Option<PathBuf>,
        /// Keep the guests' console logs afterwards (DSM applications)
        #[arg(long)]
        keep: bool,
        /// Application threads per node (1..=16). Each guest gets at least this many vCPUs
        /// (the cluster file's vcpus when larger)
        #[arg(long, default_value_t = 1)]
        threads: u32,
        /// Where the DSM protocol handles messages: irq (the completion handler, the
        /// paper's kernel/IB), workqueue (a kernel task queue), user-sim (the paper's
        /// simulation of a user-level DSM: a signal to the application's service thread,
        /// mprotect for page protections, 1 us per call a user-level DSM would make),
        /// user (a real user-level DSM: the protocol in the application's process over
        /// libibverbs, SIGSEGV and mprotect, a service thread on a completion channel),
        /// user-poll (the same, its service thread polling the CQ)
        #[arg(long, value_enum, default_value = "irq")]
        mode: dsmrun::Mode,
        /// Arguments for the application
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run a benchmark on its own guests and print a table
    ///
    /// Every bench boots on the backend --backend or the cluster file chooses (`vmm`: both),
    /// with the file's guest size, kernel arguments, capture and fault plan (link faults;
    /// node kills need `up` or `run`).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// (internal) the background process `up` starts
    #[command(hide = true)]
    Daemon {
        #[arg(long)]
        config: PathBuf,
    },
}

/// What `hcabench link` makes of an inter-switch link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LinkState {
    /// Cut the link
    Down,
    /// Restore it
    Up,
    /// Put a fault rule on it (the options)
    Faults,
    /// Take the rule `faults` put on it off (back to the fault plan)
    Clear,
}

/// `hcabench link faults`' rule.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
struct LinkFaultArgs {
    /// Probability that a packet is dropped
    #[arg(long, value_name = "P")]
    drop: Option<f64>,
    /// Probability that a packet is sent twice
    #[arg(long, value_name = "P")]
    duplicate: Option<f64>,
    /// Probability that a packet is held for later ones to overtake
    #[arg(long, value_name = "P")]
    reorder: Option<f64>,
    /// Probability that a packet's bits are flipped (its receiver drops it)
    #[arg(long, value_name = "P")]
    corrupt: Option<f64>,
    /// Delay added to every packet, in microseconds
    #[arg(long, value_name = "US")]
    delay: Option<u64>,
    /// Random extra delay up to this, in microseconds (with --delay)
    #[arg(long, value_name = "US", requires = "delay")]
    jitter: Option<u64>,
}

impl LinkFaultArgs {
    /// The rule as `hcabench fault`'s words (`drop 0.01 delay 200 50`).
    fn words(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if let Some(p) = p {
                w.extend([name.to_string(), p.to_string()]);
            }
        }
        if let Some(d) = self.delay {
            w.extend(["delay".to_string(), d.to_string()]);
            if let Some(j) = self.jitter {
                w.push(j.to_string());
            }
        }
        w
    }
}

/// The cluster file and what overrides it, for every command that boots guests.
#[derive(clap::Args, Clone)]
struct ClusterArgs {
    /// Cluster file (TOML); without it every field takes its default
    #[arg(long)]
    config: Option<PathBuf>,
    /// Which VMM runs the guests (overrides the file): auto picks kvm where KVM can run a
    /// Linux guest at native speed and qemu (TCG) elsewhere, and says why
    #[arg(long, value_enum)]
    backend: Option<config::Backend>,
    /// Run the fabric under this seeded fault plan (TOML: per-link drop, duplicate,
    /// reorder, corrupt, delay, link-down windows; see README). Decisions are logged to
    /// faults.jsonl in the run directory; `hcabench down` prints a report
    #[arg(long, value_name = "PLAN")]
    faults: Option<PathBuf>,
    /// Write every fabric packet to this pcap file (LRH, BTH, extended headers, payload,
    /// ICRC, VCRC), as its sender put it on the wire: open it in Wireshark or tshark
    #[arg(long, value_name = "FILE")]
    capture: Option<PathBuf>,
    /// How the capture frames packets: erf (ERF InfiniBand records, which Wireshark
    /// decodes) or infiniband (bare frames, LINKTYPE_INFINIBAND 247, which Wireshark's file
    /// reader does not know)
    #[arg(long, value_enum, default_value = "erf")]
    capture_format: config::CaptureFormat,
    /// The subnet's PacketLifeTime, 0 to 30 (overrides the file; default 18, OpenSM's):
    /// ib_cm gives RC connections an ACK timeout from it, about 2.1 s at 18 and 134 ms at
    /// 13 or less, which is how long a lost packet stalls one. Lower it for fault plans.
    /// (It reaches connections made through ib_cm or rdma_cm: IPoIB-CM, NVMe-oF, SRP, RDS,
    /// NFS; the DSM module and vbench set a 67 ms timeout of their own)
    #[arg(long, value_name = "N")]
    packet_life_time: Option<u8>,
    /// The guests' kernel (overrides the file's `kernel`): a Debian version (6.1, 6.12) or
    /// image name (6.12.117+deb12-amd64), built into an image first if there is none; or
    /// the path of a developer's kernel: a built tree (`make` done) or a directory holding
    /// a bzImage or vmlinux and lib/modules from `make modules_install
    /// INSTALL_MOD_PATH=DIR`. hcabench's modules are built against it and its own RDMA
    /// modules (ib_core, ib_ipoib, ...) load in the guests, so a change to them is tested
    /// by `make` and this. Default: the image `images/build.py` builds with no --kernel
    #[arg(long, value_name = "VERSION|PATH")]
    kernel: Option<String>,
    /// Seconds to wait for the guests to boot
    #[arg(long, default_value_t = 180)]
    timeout: u64,
}

/// The benchmarks; each has its own options.
#[derive(Subcommand)]
enum BenchCmd {
    /// Kernel verbs round trips and RDMA bandwidth, hcab0 against SoftRoCE
    ///
    /// Kernel RC ping-pong round trips with the receiver handling completions by polling,
    /// in the interrupt handler, in a workqueue and in a woken user process (the paper's
    /// Table 1), and RDMA Write/Read bandwidth, over the hcabench HCA and over SoftRoCE
    /// (rdma_rxe) between the same two guests (on their virtio-net NICs, under either
    /// backend), with the ratios.
    Verbs {
        #[command(flatten)]
        pings: PingArgs,
        /// RDMA operation sizes in bytes (up to 1 MiB)
        #[arg(long, value_delimiter = ',', default_value = "4096,65536,1048576")]
        bw_sizes: Vec<u32>,
        /// Bytes moved per RDMA bandwidth cell
        #[arg(long, default_value_t = 16 << 20)]
        bw_bytes: u64,
        #[command(flatten)]
        on: BenchOn,
    },
    /// DSM fault latency per protocol configuration, and the protection primitive
    ///
    /// On three guests: remote read- and write-fault latency with the protocol run in the
    /// completion handler and in process context, read faults served by RDMA Write and by
    /// RDMA Read; and the page-protection primitive against mprotect for groups of 1, 16
    /// and 32 pages.
    Dsm {
        /// Protection changes timed per group size in the primitive's table (1..=100000)
        #[arg(long, default_value_t = 500)]
        iters: u64,
        /// Pages faulted per fault-latency cell (1..=1024)
        #[arg(long, default_value_t = 128)]
        pages: u64,
        #[command(flatten)]
        on: BenchOn,
    },
    /// hcabench's VMM against QEMU/KVM (needs KVM that runs Linux)
    ///
    /// Two guests under hcabench's own VMM, then two under QEMU with -accel kvm and the
    /// device server: boot time to userspace and verified RC ping-pong round trips (poll
    /// and interrupt handler) side by side.
    Vmm {
        #[command(flatten)]
        pings: PingArgs,
        #[command(flatten)]
        on: BenchOn,
    },
    /// IP over the fabric: ping and TCP over IPoIB (datagram, connected) vs virtio-net
    ///
    /// Debian's IPoIB on hcab0 between two guests, in datagram and in connected mode,
    /// against the guests' virtio-net link: ping round trip and TCP throughput (checked by
    /// md5), with ratios.
    Ipoib {
        /// Pings per link (1..=1000)
        #[arg(long, default_value_t = 500)]
        iters: u64,
        /// Bytes sent over TCP per link (rounded down to whole MiB, at least 1)
        #[arg(long, default_value_t = 16 << 20)]
        bw_bytes: u64,
        #[command(flatten)]
        on: BenchOn,
    },
    /// User-level verbs: Debian's perftest on hcab0 (kernel bypass) and on SoftRoCE
    ///
    /// ib_send_lat, ib_write_lat and ib_read_lat (8 bytes), ib_write_bw and ib_read_bw
    /// (64 KiB) and ib_atomic_bw between two guests, over hcab0 through libhcab and over
    /// rxe0 through Debian's librxe in the same run, with ratios; and the kernel's polled RC
    /// round trip (vbench) on the same guests beside ib_send_lat's.
    Perftest {
        /// Iterations per latency test (10..=100000)
        #[arg(long, default_value_t = 1000)]
        iters: u64,
        /// Bytes per bandwidth test (in 64 KiB messages)
        #[arg(long, default_value_t = 64 << 20)]
        bw_bytes: u64,
        #[command(flatten)]
        on: BenchOn,
    },
    /// NFS over the fabric: over RDMA vs over TCP on IPoIB (datagram, connected)
    ///
    /// Debian's nfsd on one guest exports a tmpfs; the other mounts it over RDMA (port
    /// 20049) and over TCP on ib0, writes a file through each (flushed to the server) and
    /// reads it back with its page cache dropped, bytes checked by md5; then TCP again with
    /// IPoIB in connected mode. Write and read MB/s, with ratios to RDMA.
    Nfs {
        /// Bytes written and read per transport (whole MiB, at least 1; at most a quarter
        /// of a guest's memory)
        #[arg(long, default_value_t = 32 << 20)]
        bw_bytes: u64,
        #[command(flatten)]
        on: BenchOn,
    },
    /// The paper's Table 2: every DSM application per node count, threads, mode and load
    ///
    /// Every DSM application on each of --app-nodes, with each of --threads per node, in
    /// each of --modes (irq: the completion handler; workqueue: a kernel task queue;
    /// user-sim: the paper's simulated user-level DSM; user: a real user-level DSM over
    /// libibverbs, its service thread on a completion channel; user-poll: the same,
    /// polling its CQ), idle and/or beside one CPU-bound
    /// process per guest (--load); every run verified; times, the modes' ratios, faults,
    /// messages, and the speedup where the host has a core per guest vCPU.
    Apps {
        /// The applications
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "sor,lu,is,tsp,water,nbody,nbodyw,barnes"
        )]
        apps: Vec<dsmrun::Job>,
        /// Node counts (one cluster booted for each)
        #[arg(long, value_delimiter = ',', default_value = "2,4")]
        app_nodes: Vec<usize>,
        /// Application threads per node (guests get as many vCPUs as the largest)
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<u32>,
        /// Protocol modes; ratios are against the first
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "irq,workqueue,user-sim,user"
        )]
        modes: Vec<dsmrun::Mode>,
        /// One CPU-bound process per guest beside the application (the paper's load
        /// experiment): off, on, or both
        #[arg(long, value_enum, default_value = "both")]
        load: apps_bench::Load,
        #[command(flatten)]
        on: BenchOn,
    },
    /// Every communication layer on one pair of guests: latency and bandwidth, with ratios
    ///
    /// The Linux cluster study's latency table and bandwidth curve, on two guests booted
    /// once: a one-byte ping-pong (round trip, mean and median over --rounds) and
    /// bandwidth at each of --sizes, for each layer, with its ratio to kernel verbs. Every
    /// figure is measured in this run; data is checked where the tool can.
    ///
    /// Rows (latency / bandwidth):
    ///   kernel verbs       vbench RC SEND of 8 B (its smallest), both sides polling, data
    ///                      checked / RDMA WRITE, 16 in flight, bytes checked after
    ///   user verbs         perftest over hcab0 through libhcab (kernel bypass):
    ///                      ib_send_lat -s 1 (2 x t_avg, 2 x t_typical) / ib_write_bw
    ///   MPI / UCX          (--mpi) NetPIPE (NPmpich2) under MPICH over UCX on hcab0: 1 B
    ///                      (2 x its time; mean only) / its bandwidth at each size
    ///   MPI / TCP ib0      (--mpi) the same with UCX's tcp transport on ib0
    ///   TCP ib0 datagram   tipc-echo over TCP (TCP_NODELAY) on IPoIB in datagram mode:
    ///                      1 B echoed / writes of SIZE to a sink that checks every byte
    ///   TCP ib0 connected  the same with IPoIB in connected mode (RC, MTU 65520)
    ///   TIPC RDM           tipc-echo over a TIPC reliable-datagram socket, bearer ib0
    ///                      (latency only)
    ///   TIPC stream        tipc-echo over a TIPC stream socket / to a checking sink
    ///   RDS                rds-echo (rds_rdma: RC through rdma_cm): 1 B echoed / 8
    ///                      messages of SIZE in flight, each echoed back and checked (one
    ///                      direction's payload rate)
    ///   TCP virtio-net     tipc-echo over TCP on the guests' virtio-net NICs
    ///
    /// MPI's rows need MPICH and NetPIPE on the guests: --mpi adds Debian's mpich and
    /// netpipe-mpich2 to the cluster's packages (a userland disk built on first use) and
    /// gives each guest 512 MiB or more; each size is a NetPIPE job of its own, which
    /// makes the run several minutes longer, so they are off by default. Defaults finish
    /// in a few minutes on two cores under TCG.
    #[command(verbatim_doc_comment)]
    Stack {
        /// One-byte round trips per layer (10..=100000)
        #[arg(long, default_value_t = 1000)]
        rounds: u64,
        /// Bandwidth message sizes in bytes (1..=1048576)
        #[arg(long, value_delimiter = ',', default_value = "1024,65536,1048576")]
        sizes: Vec<u32>,
        /// Bytes per bandwidth cell (at least 10 messages of each size go)
        #[arg(long, default_value_t = 8 << 20)]
        bw_bytes: u64,
        /// MPI's rows too (MPICH over UCX on hcab0 and over TCP on ib0, NetPIPE)
        #[arg(long)]
        mpi: bool,
        #[command(flatten)]
        on: BenchOn,
    },
}

/// Ping-pong round trips: how many, of what sizes.
#[derive(clap::Args, Clone)]
struct PingArgs {
    /// Round trips per mode and size (1..=100000)
    #[arg(long, default_value_t = 500)]
    iters: u64,
    /// Ping-pong message sizes in bytes (8..4096)
    #[arg(long, value_delimiter = ',', default_value = "8,64,512,4096")]
    sizes: Vec<u32>,
}

/// The guests a bench boots.
#[derive(clap::Args, Clone)]
struct BenchOn {
    /// Guest image directory (overrides the cluster file's image_dir)
    #[arg(long)]
    image_dir: Option<PathBuf>,
    /// Keep the guests' console logs afterwards
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[derive(clap::Args, Clone)]
struct UpArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Number of guests, 1 to 64 (overrides the file)
    #[arg(long)]
    nodes: Option<usize>,
    /// Pass a host PCI function through to a node's guest, next to its emulated HCA:
    /// NODE=SYSFS_PATH, e.g. node1=/sys/bus/pci/devices/0000:03:00.0 (bound to vfio-pci).
    /// Repeatable; needs the kvm backend and an hcabench built with `--features vfio`
    #[arg(long, value_name = "NODE=PATH", value_parser = parse_vfio)]
    vfio: Vec<(String, PathBuf)>,
    /// A Debian package (with its dependencies) for the guests, beside python3, pyverbs and
    /// iproute2: built onto the shared userland disk (images/build.py --package) and laid
    /// under /usr at boot. Repeatable; adds to the file's `packages`
    #[arg(long = "package", value_name = "NAME")]
    packages: Vec<String>,
    /// Which of the cluster file's [[host]] tables this is, for a cluster that spans
    /// hosts: this host boots that host's nodes, listens for the others at its address,
    /// and joins their subnet (run `hcabench up --host NAME` on each; the first runs the SM)
    #[arg(long, value_name = "NAME")]
    host: Option<String>,
    /// With --host: start the other hosts too, over ssh, while this one boots: `hcabench up
    /// --config FILE --host NAME` on each (its `ssh = "user@machine"` in the cluster file;
    /// FILE at the same path there, hcabench in the PATH ssh gives, or $HCABENCH_REMOTE;
    /// the ssh command is $HCABENCH_SSH, default `ssh -o BatchMode=yes -o ConnectTimeout=10`). Their output is
    /// shown marked with each host's name
    #[arg(long, requires = "host", requires = "config")]
    start_others: bool,
}

fn main() -> ExitCode {
    // What the device and the hosts decide goes to stderr (the daemon's: daemon.log):
    // warnings by default, RUST_LOG=debug for every refused command, QP error and NAK.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Status | Cmd::Fabric | Cmd::Counters { .. }) {
        // Listings end quietly when their reader does (`hcabench fabric | head`), as other
        // tools' do, rather than panic on the closed pipe. Only these: a command that holds
        // guests or sockets must hear of a closed one as an error, not die of it.
        // SAFETY: SIG_DFL is a valid disposition; nothing else here handles SIGPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let run = RunDir::resolve(cli.run_dir);
    let result = match cli.cmd {
        Cmd::Up(a) => up_all(&run, &a),
        Cmd::Down {
            others,
            config,
            host,
        } => down_all(&run, others, config.as_deref().zip(host.as_deref())),
        Cmd::Status => status(&run),
        Cmd::Fabric => fabric_cmd(&run),
        Cmd::Counters { node } => counters_cmd(&run, node.as_deref()),
        Cmd::Console { node } => console_cmd(&run, &node),
        Cmd::Exec(a) => return exec::main(&run, &a),
        Cmd::Mpirun(a) => return mpirun::main(&run, &a),
        Cmd::Cp(a) => copy::run(&run, &a).map_err(Error::from),
        Cmd::Fault { node, action } => fault_cmd(&run, &node, &action),
        Cmd::Partition {
            pkey,
            members,
            limited,
            remove,
        } => partition_cmd(&run, &pkey, &members, &limited, remove),
        Cmd::Link {
            state,
            switch,
            other,
            n,
            faults,
        } => link_cmd(&run, state, &switch, &other, n, &faults),
        Cmd::Run {
            app,
            up: a,
            transport,
            image_dir,
            keep,
            threads,
            mode,
            args,
        } => match app {
            dsmrun::Job::Probe => run_probe(&run, &a),
            app => dsm_app(
                &a,
                app,
                transport,
                image_dir,
                keep,
                dsmrun::AppShape { threads, mode },
                args,
            ),
        },
        Cmd::Bench { what } => bench_cmd(what),
        Cmd::Daemon { config } => ClusterConfig::load(&config)
            .map_err(daemon::DaemonError::from)
            .and_then(|c| daemon::run(&run, &c))
            .map_err(Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hcabench: {}", error::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The cluster file (or the defaults) with the flags over it, checked: backend, nodes,
/// image directory, packet lifetime, fault plan (checked; made absolute) and capture (made
/// absolute).
fn resolve(
    a: &ClusterArgs,
    nodes: Option<usize>,
    image_dir: Option<PathBuf>,
) -> Result<ClusterConfig, Error> {
    let mut c = match &a.config {
        Some(p) => ClusterConfig::load(p)?,
        None => ClusterConfig::default(),
    };
    if let Some(n) = nodes {
        c.nodes = n;
    }
    if let Some(b) = a.backend {
        c.backend = b;
    }
    if let Some(l) = a.packet_life_time {
        c.packet_life_time = l;
    }
    if let Some(d) = image_dir {
        c.image_dir = d;
    }
    if let Some(f) = &a.faults {
        c.faults = Some(f.clone());
    }
    if let Some(f) = &c.faults {
        let plan = faultrun::load_plan(f)?;
        // (Across hosts the links are implicit where no [[link]] names them: the daemon
        // checks against the subnet it cables.)
        if c.host.is_empty() {
            faultrun::check_switch_links(&plan, c.link.len(), f)?;
        }
        c.faults = Some(std::fs::canonicalize(f).unwrap_or(f.clone()));
    }
    if let Some(p) = &a.capture {
        c.capture = Some(absolute(p)?);
        c.capture_format = a.capture_format;
    }
    if let Some(k) = &a.kernel {
        c.kernel = Some(k.clone());
    }
    c.validate()?;
    Ok(c)
}

fn load_config(a: &UpArgs) -> Result<ClusterConfig, Error> {
    let mut c = resolve(&a.cluster, a.nodes, None)?;
    c.vfio.extend(a.vfio.iter().cloned());
    c.packages.extend(a.packages.iter().cloned());
    if let Some(h) = &a.host {
        if c.host.is_empty() {
            return Err(UsageError::NoHosts(h.clone()).into());
        }
        c.this_host = Some(h.clone());
    }
    if !c.host.is_empty() && c.this_host.is_none() {
        let names: Vec<&str> = c.host.iter().map(|h| h.name.as_str()).collect();
        return Err(UsageError::WhichHost(names.join(", ")).into());
    }
    c.validate()?;
    let (backend, why) = daemon::choose_backend(&c)?;
    if backend == Backend::Qemu {
        if !c.vfio.is_empty() {
            return Err(UsageError::VfioNeedsKvm { why }.into());
        }
        cluster::qemu::qemu_available()?;
    }
    // A developer's kernel (or a Debian one not built yet) becomes an image here, with its
    // progress shown, before any guest boots; the daemon then boots exactly that image.
    c.build_image()?;
    Ok(c)
}

/// `p` made absolute (the daemon runs elsewhere), its directory checked to exist.
fn absolute(p: &std::path::Path) -> Result<PathBuf, Error> {
    let p = std::path::absolute(p).map_err(|source| Error::Path {
        path: p.to_path_buf(),
        source,
    })?;
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() && !d.is_dir() => Err(Error::NoDir {
            dir: d.to_path_buf(),
            path: p,
        }),
        _ => Ok(p),
    }
}

fn parse_vfio(s: &str) -> Result<(String, PathBuf), UsageError> {
    match s.split_once('=') {
        Some((node, path)) if !node.is_empty() && !path.is_empty() => {
            Ok((node.to_string(), PathBuf::from(path)))
        }
        _ => Err(UsageError::Vfio),
    }
}

/// `up`'s options that are the whole cluster's, as the other hosts' `up` takes them
/// (paths made absolute: they must name the same files there).
fn cluster_options(a: &UpArgs) -> Result<Vec<String>, Error> {
    use clap::ValueEnum;
    let c = &a.cluster;
    let mut o = vec!["--timeout".to_string(), c.timeout.to_string()];
    let name = |v: Option<clap::builder::PossibleValue>| v.map(|v| v.get_name().to_string());
    if let Some(b) = c.backend.and_then(|b| name(b.to_possible_value())) {
        o.extend(["--backend".to_string(), b]);
    }
    if let Some(l) = c.packet_life_time {
        o.extend(["--packet-life-time".to_string(), l.to_string()]);
    }
    if let Some(k) = &c.kernel {
        // A kernel tree by its path, or a Debian version by its name.
        let k = match std::path::Path::new(k).exists() {
            true => absolute(std::path::Path::new(k))?.display().to_string(),
            false => k.clone(),
        };
        o.extend(["--kernel".to_string(), k]);
    }
    if let Some(f) = &c.faults {
        o.extend(["--faults".to_string(), absolute(f)?.display().to_string()]);
    }
    if let Some(p) = &c.capture {
        o.extend(["--capture".to_string(), absolute(p)?.display().to_string()]);
        if let Some(f) = name(c.capture_format.to_possible_value()) {
            o.extend(["--capture-format".to_string(), f]);
        }
    }
    if let Some(n) = a.nodes {
        o.extend(["--nodes".to_string(), n.to_string()]);
    }
    for p in &a.packages {
        o.extend(["--package".to_string(), p.clone()]);
    }
    Ok(o)
}

/// `up`, and with `--start-others` every other host's `up` over ssh at the same time
/// (`launch`): each host boots its own nodes, and the hosts join as they come.
fn up_all(run: &RunDir, a: &UpArgs) -> Result<(), Error> {
    let (true, Some(path), Some(here)) = (a.start_others, &a.cluster.config, &a.host) else {
        return up(run, a).map(|_| ());
    };
    // The file and every other host's ssh checked before anything starts.
    let mut file = ClusterConfig::load(path)?;
    file.this_host = Some(here.clone());
    file.validate()?;
    let path = std::fs::canonicalize(path).map_err(|source| Error::Path {
        path: path.clone(),
        source,
    })?;
    let others = launch::others(&file.host, here)?;
    if let Some(s) = run.live_state() {
        return Err(Error::AlreadyUp {
            nodes: s.nodes.len(),
            dir: run.dir().to_path_buf(),
        });
    }
    let remotes = launch::start_others(&file.host, here, &path, &cluster_options(a)?)?;
    let local = up(run, a);
    let results: Vec<(String, Result<(), launch::LaunchError>)> = (remotes.into_iter())
        .map(|r| (r.host().to_string(), r.wait()))
        .collect();
    if let Err(e) = local {
        // Nothing half up: the hosts that started go down again.
        for (host, _) in results.iter().filter(|(_, r)| r.is_ok()) {
            if let Some((_, dest)) = others.iter().find(|(h, _)| &h.name == host) {
                println!("host {host}: stopping it again over ssh ({dest})");
                let _ = launch::start(host, dest, &["down"]).and_then(launch::Remote::wait);
            }
        }
        return Err(e);
    }
    let failed: Vec<launch::LaunchError> =
        (results.into_iter()).filter_map(|(_, r)| r.err()).collect();
    match failed.into_iter().next() {
        Some(e) => {
            println!(
                "host {here} is up; `hcabench down --others` stops it and the hosts that \
                 started"
            );
            Err(e.into())
        }
        None => {
            println!("all {} hosts up", file.host.len());
            Ok(())
        }
    }
}

fn up(run: &RunDir, a: &UpArgs) -> Result<ClusterState, Error> {
    if let Some(s) = run.live_state() {
        return Err(Error::AlreadyUp {
            nodes: s.nodes.len(),
            dir: run.dir().to_path_buf(),
        });
    }
    let mut cfg = load_config(a)?;
    let (backend, why) = daemon::choose_backend(&cfg)?;
    cfg.image_dir = std::fs::canonicalize(&cfg.image_dir).unwrap_or(cfg.image_dir);
    cluster::create_private_dir(run.dir()).map_err(|source| Error::Create {
        path: run.dir().to_path_buf(),
        source,
    })?;
    let cfg_file = run.path("cluster.toml");
    std::fs::write(&cfg_file, toml::to_string(&cfg)?).map_err(|source| Error::Write {
        path: cfg_file.clone(),
        source,
    })?;
    let kernel = cfg.image()?.kernel_version;
    match &cfg.this_host {
        Some(host) => {
            let local = cfg.hosts().unwrap_or_default().local_nodes(cfg.nodes);
            println!(
                "host {host}: booting node{}..node{} of the cluster's {} nodes, kernel \
                 {kernel} ({backend}: {why})",
                local.start + 1,
                local.end,
                cfg.nodes
            );
        }
        None => println!(
            "booting {} nodes, kernel {kernel} ({backend}: {why})",
            cfg.nodes
        ),
    }
    let started = Instant::now();
    let pid = daemon::spawn(run, &cfg_file).map_err(Error::Spawn)?;
    let deadline = started + Duration::from_secs(a.cluster.timeout);
    let state = loop {
        if let Some(s) = run.read_state().filter(|s| s.daemon_pid == pid) {
            break s;
        }
        if !pid_alive(pid) || Instant::now() > deadline {
            let log = std::fs::read_to_string(run.path("daemon.log")).unwrap_or_default();
            return Err(Error::NotStarted(log.trim().to_string()));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for n in &state.nodes {
        print!("  {}: booting ...", n.name);
        let _ = std::io::Write::flush(&mut std::io::stdout());
        if backend == Backend::Kvm {
            // The first userspace line comes seconds after the kernel starts under KVM: a
            // guest that has not printed it by the deadline is stuck in the kernel.
            if let Err(e) = wait_console(run, n, INIT, deadline, pid) {
                println!(" failed");
                let _ = down(run);
                return Err(Error::KvmBoot {
                    node: n.name.clone(),
                    source: e,
                    timeout: Duration::from_secs(a.cluster.timeout),
                });
            }
        }
        match wait_console(run, n, READY, deadline, pid) {
            Ok(()) => println!(" ready ({:.1?})", started.elapsed()),
            Err(e) => {
                println!(" failed");
                let _ = down(run);
                return Err(Error::NotReady {
                    node: n.name.clone(),
                    source: e,
                });
            }
        }
    }
    let (first, last) = match (state.nodes.first(), state.nodes.last()) {
        (Some(f), Some(l)) => (f.clone(), l.clone()),
        _ => return Err(Error::NotStarted("the daemon started no node".into())),
    };
    println!(
        "cluster up: {} nodes, LIDs {}..={}; consoles logged in {}",
        state.nodes.len(),
        first.lid,
        last.lid,
        run.dir().display()
    );
    if cfg.this_host.is_some() {
        println!(
            "the other hosts join with `hcabench up --host NAME`; `hcabench fabric` shows the \
             links to them"
        );
    }
    if cfg.sm == config::SubnetManager::Guest {
        println!(
            "sm = \"guest\": the ports wait in INIT for a subnet manager; start one in a node \
             (`hcabench exec {} -- 'userland-up && opensm -B'`, with opensm in `packages`)",
            first.name
        );
    }
    println!(
        "attach: hcabench console {}    stop: hcabench down",
        first.name
    );
    Ok(state)
}

/// Waits for a console line starting with `prefix` on node `n`'s console. A guest whose
/// process ended is over only once the daemon says so on its console ([`daemon::GUEST_STOPPED`])
/// or is gone itself: the daemon boots a guest whose kernel crashed on its way up again, under
/// a new process it writes into the state.
fn wait_console(
    run: &RunDir,
    n: &rundir::NodeState,
    prefix: &str,
    deadline: Instant,
    daemon_pid: u32,
) -> Result<(), BootWait> {
    let mut pid = n.pid;
    loop {
        let text = std::fs::read(&n.console_log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        if complete_lines(&text).iter().any(|l| l.starts_with(prefix)) {
            return Ok(());
        }
        if text.contains(daemon::GUEST_STOPPED) {
            return Err(BootWait::Stopped(text.trim().to_string()));
        }
        if !pid_alive(pid) {
            let now = (run.read_state().filter(|s| s.daemon_pid == daemon_pid))
                .and_then(|s| s.nodes.into_iter().find(|m| m.name == n.name));
            match now {
                Some(m) if m.pid != pid => pid = m.pid,
                _ if !pid_alive(daemon_pid) => {
                    return Err(BootWait::Exited(text.trim().to_string()))
                }
                _ => {}
            }
        }
        if Instant::now() > deadline {
            return Err(BootWait::Late(text.trim().to_string()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `down`, and with `others` the other hosts' `down` over ssh first (while this host's
/// state still names them).
fn down_all(
    run: &RunDir,
    others: bool,
    file: Option<(&std::path::Path, &str)>,
) -> Result<(), Error> {
    if others {
        let live = run.live_state();
        // This host's state names the others; without it, the cluster file does.
        let (hosts, here) = match (&live, file) {
            (Some(s), _) => (s.config.host.clone(), s.config.this_host.clone()),
            (None, Some((path, host))) => {
                let c = ClusterConfig::load(path)?;
                if !c.host.iter().any(|h| h.name == host) {
                    let names: Vec<&str> = c.host.iter().map(|h| h.name.as_str()).collect();
                    return Err(UsageError::NoSuchHost {
                        name: host.to_string(),
                        hosts: names.join(", "),
                    }
                    .into());
                }
                (c.host, Some(host.to_string()))
            }
            (None, None) => {
                println!(
                    "no cluster is up in {}; to stop the other hosts from the cluster file: \
                     hcabench down --others --config FILE --host NAME",
                    run.dir().display()
                );
                return Ok(());
            }
        };
        let here = here.unwrap_or_default();
        let mut remotes = Vec::new();
        let mut failed = Vec::new();
        for h in hosts.iter().filter(|h| h.name != here) {
            let Some(dest) = &h.ssh else {
                println!(
                    "host {}: no `ssh` in the cluster file; stop it there with `hcabench down`",
                    h.name
                );
                continue;
            };
            println!("host {}: stopping it over ssh ({dest})", h.name);
            match launch::start(&h.name, dest, &["down"]) {
                Ok(r) => remotes.push(r),
                Err(e) => failed.push(e),
            }
        }
        failed.extend(remotes.into_iter().filter_map(|r| r.wait().err()));
        if live.is_some() {
            down(run)?;
        }
        if let Some(e) = failed.into_iter().next() {
            return Err(e.into());
        }
        return Ok(());
    }
    down(run)
}

fn down(run: &RunDir) -> Result<(), Error> {
    let Some(s) = run.live_state() else {
        println!("no cluster is up in {}", run.dir().display());
        return Ok(());
    };
    // SAFETY: kill only sends a signal to the daemon's pid, recorded by the daemon itself.
    unsafe { libc::kill(s.daemon_pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_alive(s.daemon_pid) {
        if Instant::now() > deadline {
            return Err(Error::DaemonStuck(s.daemon_pid));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("cluster of {} nodes stopped", s.nodes.len());
    if let Some(c) = &s.config.capture {
        println!("  fabric capture: {}", c.display());
    }
    if let Ok(r) = std::fs::read_to_string(run.path(faultrun::REPORT)) {
        print!("{r}");
        println!("  decisions: {}", run.path(faultrun::LOG).display());
    }
    Ok(())
}

fn status(run: &RunDir) -> Result<(), Error> {
    let Some(s) = run.live_state() else {
        println!("no cluster is up in {}", run.dir().display());
        return Ok(());
    };
    println!(
        "cluster up in {}: {} nodes, backend {}, kernel {}, daemon pid {}",
        run.dir().display(),
        s.nodes.len(),
        s.backend,
        s.kernel,
        s.daemon_pid
    );
    println!(
        "  {:<8} {:>4} {:>9} {:<8} {:>7} {:<16} {:<22} console log",
        "node", "LID", "pid", "state", "RAM MiB", "ib0 (IPoIB)", "kernel"
    );
    for n in &s.nodes {
        let log = std::fs::read(&n.console_log).unwrap_or_default();
        let log = complete_lines(&String::from_utf8_lossy(&log));
        let stopped = log.iter().any(|l| l.starts_with(daemon::GUEST_STOPPED));
        let state = if !pid_alive(n.pid) || stopped {
            "dead"
        } else if log.iter().any(|l| l.starts_with(READY)) {
            "ready"
        } else {
            "booting"
        };
        // init.sh's IPOIB line: `HCABENCH-IPOIB ib0 addr=10.78.0.1/16`.
        let ib0 = log
            .iter()
            .filter_map(|l| l.strip_prefix(IPOIB))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
            .unwrap_or("-")
            .to_string();
        let ram = s.config.memory_mib_of(&n.name);
        // What the guest itself reports running (init.sh's INIT line: `kernel=$(uname -r)`).
        let kernel = log
            .iter()
            .filter_map(|l| l.strip_prefix(INIT))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("kernel=")))
            .unwrap_or("-")
            .to_string();
        println!(
            "  {:<8} {:>4} {:>9} {:<8} {:>7} {:<16} {:<22} {}",
            n.name,
            n.lid,
            n.pid,
            state,
            ram,
            ib0,
            kernel,
            n.console_log.display()
        );
    }
    Ok(())
}

fn console_cmd(run: &RunDir, node: &str) -> Result<(), Error> {
    let s = exec::live_cluster(run)?;
    let n = exec::find_node(&s, node)?;
    Ok(console::attach(&n.console_socket, &n.name)?)
}

fn fault_cmd(run: &RunDir, node: &str, action: &[String]) -> Result<(), Error> {
    exec::live_cluster(run)?;
    let reply = control::request(run.dir(), &format!("fault {node} {}", action.join(" ")))?;
    println!("{reply}");
    Ok(())
}

fn partition_cmd(
    run: &RunDir,
    pkey: &str,
    members: &str,
    limited: &str,
    remove: bool,
) -> Result<(), Error> {
    exec::live_cluster(run)?;
    let digits = pkey.strip_prefix("0x").or_else(|| pkey.strip_prefix("0X"));
    let value = match digits {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => pkey.parse::<u16>(),
    }
    .map_err(|_| UsageError::PKey(pkey.to_string()))?;
    let list = |names: &str| {
        if names.is_empty() {
            "-".to_string()
        } else {
            names.to_string()
        }
    };
    let request = if remove {
        format!("partition {value:#06x} remove")
    } else {
        format!("partition {value:#06x} {} {}", list(members), list(limited))
    };
    println!("{}", control::request(run.dir(), &request)?);
    Ok(())
}

fn link_cmd(
    run: &RunDir,
    state: LinkState,
    switch: &str,
    other: &str,
    n: Option<u32>,
    faults: &LinkFaultArgs,
) -> Result<(), Error> {
    let request = link_request(state, switch, other, n, faults)?;
    exec::live_cluster(run)?;
    println!("{}", control::request(run.dir(), &request)?);
    Ok(())
}

/// The control request of `hcabench link STATE SWITCH OTHER [N] [OPTIONS]`: `link STATE A
/// B [N]`, or `link faults A B N|- RULE...`.
fn link_request(
    state: LinkState,
    switch: &str,
    other: &str,
    n: Option<u32>,
    faults: &LinkFaultArgs,
) -> Result<String, UsageError> {
    let rule = faults.words();
    let name = match state {
        LinkState::Down => "down",
        LinkState::Up => "up",
        LinkState::Clear => "clear",
        LinkState::Faults if rule.is_empty() => return Err(UsageError::LinkRule),
        LinkState::Faults => {
            let n = n.map_or("-".to_string(), |n| n.to_string());
            return Ok(format!(
                "link faults {switch} {other} {n} {}",
                rule.join(" ")
            ));
        }
    };
    if !rule.is_empty() {
        return Err(UsageError::LinkRuleWith(name));
    }
    let n = n.map_or(String::new(), |n| format!(" {n}"));
    Ok(format!("link {name} {switch} {other}{n}"))
}

/// The counters `hcabench counters` shows in its table, with their column headings.
const COUNTER_COLUMNS: [(u32, &str); 11] = [
    (hca_model::abi::CTR_TX_PACKETS, "tx pkts"),
    (hca_model::abi::CTR_RX_PACKETS, "rx pkts"),
    (hca_model::abi::CTR_TX_OCTETS, "tx MiB"),
    (hca_model::abi::CTR_RX_OCTETS, "rx MiB"),
    (hca_model::abi::CTR_RETRANSMITS, "resent"),
    (hca_model::abi::CTR_SEQ_NAKS, "seq NAKs"),
    (hca_model::abi::CTR_RNR_NAKS, "RNR NAKs"),
    (hca_model::abi::CTR_RETRY_EXCEEDED, "retry exc"),
    (hca_model::abi::CTR_DUPLICATES, "dups"),
    (hca_model::abi::CTR_UD_DROPPED, "UD drops"),
    (hca_model::abi::CTR_PKEY_VIOLATIONS, "P_Key viol"),
];

fn counters_cmd(run: &RunDir, node: Option<&str>) -> Result<(), Error> {
    use hca_model::abi::{COUNTER_NAMES, CTR_RX_OCTETS, CTR_TX_OCTETS};
    exec::live_cluster(run)?;
    let reply = control::request(run.dir(), "counters")?;
    // Per node its counters, or None while its HCA is off the fabric (`NODE -`).
    let rows: Vec<(&str, Option<Vec<u64>>)> = (reply.split(';'))
        .filter_map(|n| {
            let mut w = n.split_whitespace();
            let name = w.next()?;
            let values: Vec<u64> = w.filter_map(|v| v.parse().ok()).collect();
            Some((
                name,
                (values.len() == COUNTER_NAMES.len()).then_some(values),
            ))
        })
        .collect();
    const OFF: &str = "(its HCA is not on the fabric: guest not connected, or killed)";
    if let Some(want) = node {
        let (_, values) = (rows.iter())
            .find(|(name, _)| *name == want)
            .ok_or_else(|| Error::NoNode {
                node: want.to_string(),
                nodes: rows.len(),
            })?;
        let Some(values) = values else {
            println!("{want}: {OFF}");
            return Ok(());
        };
        for (name, v) in COUNTER_NAMES.iter().zip(values) {
            println!("{name:<20} {v}");
        }
        return Ok(());
    }
    print!("{:<8}", "node");
    for (_, heading) in COUNTER_COLUMNS {
        print!(" {heading:>10}");
    }
    println!();
    for (name, values) in &rows {
        let Some(values) = values else {
            println!("{name:<8} {OFF}");
            continue;
        };
        print!("{name:<8}");
        for (ctr, _) in COUNTER_COLUMNS {
            let v = values.get(ctr as usize).copied().unwrap_or(0);
            if ctr == CTR_TX_OCTETS || ctr == CTR_RX_OCTETS {
                print!(" {:>10.1}", v as f64 / f64::from(1u32 << 20));
            } else {
                print!(" {v:>10}");
            }
        }
        println!();
    }
    println!("(octets on the wire: headers and CRCs too; `hcabench counters NODE` shows all)");
    Ok(())
}

fn fabric_cmd(run: &RunDir) -> Result<(), Error> {
    let state = exec::live_cluster(run)?;
    if state.config.sm == config::SubnetManager::Guest {
        return user_sm_text(&control::request(run.dir(), "user-sm")?);
    }
    print!(
        "{}",
        control::switches_text(&control::request(run.dir(), "switches")?)
    );
    // On a cluster that spans hosts, the SA (groups, service records, subscriptions) is the
    // first host's, the SM's.
    let cfg = &state.config;
    if let (Some(here), Some(sm)) = (&cfg.this_host, cfg.host.first()) {
        if *here != sm.name {
            println!(
                "the SM and the SA run on host {} (`hcabench fabric` there lists the multicast \
                 groups, service records and subscriptions)",
                sm.name
            );
            return Ok(());
        }
    }
    let reply = control::request(run.dir(), "groups")?;
    println!(
        "multicast groups (the fabric's subnet administrator, SM LID {:#x}):",
        hca_model::sa::SM_LID
    );
    println!("  {:<40} {:>6} {:>10}  members", "MGID", "MLID", "Q_Key");
    for g in reply.split(';').filter(|g| !g.is_empty()) {
        let f: Vec<&str> = g.split_whitespace().collect();
        if let [mgid, mlid, qkey, members] = f.as_slice() {
            println!("  {mgid:<40} {mlid:>6} {qkey:>10}  {members}");
        }
    }
    let reply = control::request(run.dir(), "partitions")?;
    println!("partitions (every node is a full member of the default, 0xffff):");
    if reply.trim().is_empty() {
        println!("  none other ([[partition]] in the cluster file)");
    }
    for p in reply.split(';').filter(|p| !p.trim().is_empty()) {
        if let [pkey, full, limited] = p.split_whitespace().collect::<Vec<_>>().as_slice() {
            println!("  {pkey}  full: {full}  limited: {limited}");
        }
    }
    let reply = control::request(run.dir(), "registrations")?;
    if let [services, informs, life] = reply.split_whitespace().collect::<Vec<_>>().as_slice() {
        println!(
            "service records: {services}; trap subscriptions: {informs} \
             (in a guest, `saquery SR` lists the records)"
        );
        let secs = life
            .parse::<u32>()
            .map_or(0.0, |l| 4.096e-6 * f64::from(l).exp2());
        println!("packet lifetime: {life} (4.096 us x 2^{life}, {secs:.3} s; packet_life_time in the cluster file)");
    }
    Ok(())
}

/// `hcabench fabric` under a user's SM: what it set in each switch, port by port.
fn user_sm_text(reply: &str) -> Result<(), Error> {
    let state = |s: &str| match s {
        "1" => "DOWN",
        "2" => "INIT",
        "3" => "ARMED",
        "4" => "ACTIVE",
        _ => "?",
    };
    for (k, entry) in reply.split(';').enumerate() {
        let f: Vec<&str> = entry.split_whitespace().collect();
        let [name, lid, sm_lid, top, mlids, ports] = f.as_slice() else {
            continue;
        };
        if k == 0 {
            match *sm_lid {
                "0" => println!(
                    "subnet manager: a guest's (sm = \"guest\"), none yet: the ports wait in \
                     INIT (start it in a node: `opensm -B`)"
                ),
                lid => println!("subnet manager: a guest's (sm = \"guest\"), at LID {lid}"),
            }
        }
        let lid: u16 = lid.parse().unwrap_or(0);
        let name = if *name == "-" {
            String::new()
        } else {
            format!("{name} ")
        };
        println!(
            "switch {name}LID {lid:#x} ({lid}): forwards as the SM set it: unicast LIDs up \
             to {top}, {mlids} multicast LIDs"
        );
        for p in ports.split(',').filter(|p| *p != "-") {
            if let [to, port, s] = p.split(':').collect::<Vec<_>>().as_slice() {
                let to = match to.strip_prefix('@') {
                    Some(sw) => format!("switch {sw}"),
                    None => to.to_string(),
                };
                println!("  {to:<10} port {port:>3}  {}", state(s));
            }
        }
    }
    println!(
        "its SA holds the subnet's groups and records: `saquery` in a guest lists them \
         (`saquery -g` the multicast groups)"
    );
    Ok(())
}

fn dsm_app(
    a: &UpArgs,
    app: dsmrun::Job,
    transport: dsmrun::Transport,
    image_dir: Option<PathBuf>,
    keep: bool,
    shape: dsmrun::AppShape,
    args: Vec<String>,
) -> Result<(), Error> {
    let mut cfg = resolve(&a.cluster, a.nodes, image_dir)?;
    cfg.vcpus = cfg.vcpus.max(shape.threads);
    let (backend, why) = daemon::choose_backend(&cfg)?;
    println!("backend {backend} ({why})");
    dsmrun::run(&dsmrun::RunOpts {
        app,
        cfg,
        backend,
        transport,
        shape,
        args,
        boot_timeout: Duration::from_secs(a.cluster.timeout),
        keep,
    })?;
    Ok(())
}

fn run_probe(run: &RunDir, a: &UpArgs) -> Result<(), Error> {
    let state = match run.live_state() {
        Some(s) => s,
        None => up(run, a)?,
    };
    for n in &state.nodes {
        let log = std::fs::read(&n.console_log).unwrap_or_default();
        for l in complete_lines(&String::from_utf8_lossy(&log)) {
            if let Some(rest) = l.strip_prefix(PROBE).and_then(|r| r.strip_prefix(' ')) {
                if rest.starts_with("HCA found") || rest.starts_with("doorbell") {
                    println!("{}: {rest}", n.name);
                }
            }
        }
    }
    Ok(())
}

fn bench_cmd(what: BenchCmd) -> Result<(), Error> {
    let on = match &what {
        BenchCmd::Verbs { on, .. }
        | BenchCmd::Dsm { on, .. }
        | BenchCmd::Vmm { on, .. }
        | BenchCmd::Ipoib { on, .. }
        | BenchCmd::Nfs { on, .. }
        | BenchCmd::Perftest { on, .. }
        | BenchCmd::Apps { on, .. }
        | BenchCmd::Stack { on, .. } => on.clone(),
    };
    let cfg = resolve(&on.cluster, None, on.image_dir.clone())?;
    let boot_timeout = Duration::from_secs(on.cluster.timeout);
    let b = |iters, sizes, bw_sizes, bw_bytes, pages| bench::VerbsBench {
        cfg: cfg.clone(),
        boot_timeout,
        iters,
        sizes,
        bw_sizes,
        bw_bytes,
        pages,
        keep: on.keep,
    };
    let check_pings = |p: &PingArgs| {
        if p.iters == 0 || p.iters > 100_000 {
            return Err(UsageError::OutOfRange {
                what: "--iters",
                value: p.iters,
                range: "1..=100000",
            });
        }
        if p.sizes.is_empty() {
            return Err(UsageError::Empty("--sizes"));
        }
        match p.sizes.iter().find(|&&s| !(8..=4096).contains(&s)) {
            Some(&s) => Err(UsageError::OutOfRange {
                what: "ping-pong size",
                value: s.into(),
                range: "8..=4096",
            }),
            None => Ok(()),
        }
    };
    let (name, b) = match what {
        BenchCmd::Apps {
            apps,
            app_nodes,
            threads,
            modes,
            load,
            ..
        } => {
            let b = apps_bench::AppsBench {
                cfg,
                boot_timeout,
                keep: on.keep,
                apps,
                nodes: app_nodes,
                threads,
                modes,
                load,
            };
            apps_bench::check(&b)?;
            session::refuse_node_kills(&b.cfg, "bench apps")?;
            let (backend, why) = daemon::choose_backend(&b.cfg)?;
            println!("backend {backend} ({why})");
            return Ok(apps_bench::run(&b, backend)?);
        }
        BenchCmd::Stack {
            rounds,
            sizes,
            bw_bytes,
            mpi,
            ..
        } => {
            let mut b = stack_bench::StackBench {
                cfg,
                boot_timeout,
                keep: on.keep,
                rounds,
                sizes,
                bw_bytes,
                mpi,
            };
            stack_bench::check(&b)?;
            session::refuse_node_kills(&b.cfg, "bench stack")?;
            if mpi {
                stack_bench::with_mpi(&mut b.cfg)?;
            }
            let (backend, why) = daemon::choose_backend(&b.cfg)?;
            println!("backend {backend} ({why})");
            return Ok(stack_bench::run(&b, backend)?);
        }
        BenchCmd::Vmm { pings, .. } => {
            check_pings(&pings)?;
            if on.cluster.backend.is_some() {
                return Err(UsageError::VmmBackend.into());
            }
            return Ok(bench::run_vmm(&b(pings.iters, pings.sizes, vec![], 0, 0))?);
        }
        BenchCmd::Verbs {
            pings,
            bw_sizes,
            bw_bytes,
            ..
        } => {
            check_pings(&pings)?;
            if bw_sizes.is_empty() {
                return Err(UsageError::Empty("--bw-sizes").into());
            }
            if let Some(&s) = bw_sizes.iter().find(|&&s| s == 0 || s > 1 << 20) {
                return Err(UsageError::OutOfRange {
                    what: "RDMA size",
                    value: s.into(),
                    range: "1..=1048576",
                }
                .into());
            }
            ("verbs", b(pings.iters, pings.sizes, bw_sizes, bw_bytes, 0))
        }
        BenchCmd::Dsm { iters, pages, .. } => {
            if iters == 0 || iters > 100_000 {
                return Err(UsageError::OutOfRange {
                    what: "--iters",
                    value: iters,
                    range: "1..=100000",
                }
                .into());
            }
            if pages == 0 || pages > 1024 {
                return Err(UsageError::OutOfRange {
                    what: "--pages",
                    value: pages,
                    range: "1..=1024",
                }
                .into());
            }
            ("dsm", b(iters, vec![], vec![], 0, pages))
        }
        BenchCmd::Ipoib {
            iters, bw_bytes, ..
        } => {
            if iters == 0 || iters > 1000 {
                return Err(UsageError::OutOfRange {
                    what: "--iters",
                    value: iters,
                    range: "1..=1000",
                }
                .into());
            }
            ("ipoib", b(iters, vec![], vec![], bw_bytes, 0))
        }
        BenchCmd::Perftest {
            iters, bw_bytes, ..
        } => {
            if !(10..=100_000).contains(&iters) {
                return Err(UsageError::OutOfRange {
                    what: "--iters",
                    value: iters,
                    range: "10..=100000",
                }
                .into());
            }
            ("perftest", b(iters, vec![], vec![], bw_bytes, 0))
        }
        BenchCmd::Nfs { bw_bytes, .. } => {
            // The bench's two guests, server and client: the smaller bounds the file.
            let guest_mib = (0..2)
                .map(|i| cfg.memory_mib_of(&cluster::ClusterSpec::node_name(i)))
                .min()
                .unwrap_or(cfg.memory_mib);
            let most = nfs_bench::max_mib(guest_mib);
            if !(1..=most).contains(&(bw_bytes >> 20)) {
                return Err(UsageError::NfsBytes {
                    bytes: bw_bytes,
                    most,
                    guest_mib,
                }
                .into());
            }
            ("nfs", b(0, vec![], vec![], bw_bytes, 0))
        }
    };
    session::refuse_node_kills(&b.cfg, &format!("bench {name}"))?;
    let (backend, why) = daemon::choose_backend(&b.cfg)?;
    println!("backend {backend} ({why})");
    match name {
        "verbs" => bench::run(&b, backend),
        "dsm" => bench::run_dsm(&b, backend),
        "nfs" => nfs_bench::run(&b, backend),
        "perftest" => perftest_bench::run(&b, backend),
        _ => ipoib_bench::run(&b, backend),
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The control request `hcabench ARGS` makes of a `link` command line.
    fn link(args: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(["hcabench", "link"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        match cli.cmd {
            Cmd::Link {
                state,
                switch,
                other,
                n,
                faults,
            } => link_request(state, &switch, &other, n, &faults).map_err(|e| e.to_string()),
            _ => unreachable!("`link` parses as Cmd::Link"),
        }
    }

    #[test]
    fn test_start_others_needs_this_hosts_name_and_the_cluster_file() {
        let parse = |args: &[&str]| Cli::try_parse_from(["hcabench", "up"].iter().chain(args));
        assert!(parse(&["--config", "c.toml", "--host", "a", "--start-others"]).is_ok());
        for bad in [
            &["--start-others"][..],
            &["--config", "c.toml", "--start-others"],
            &["--host", "a", "--start-others"],
        ] {
            let e = parse(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("required"), "{bad:?}: {e}");
        }
        assert!(Cli::try_parse_from(["hcabench", "down", "--others"]).is_ok());
        // The other hosts get this host's cluster-wide options, which their `up` takes.
        let cli = parse(&[
            "--config",
            "c.toml",
            "--host",
            "a",
            "--start-others",
            "--backend",
            "qemu",
            "--timeout",
            "90",
            "--package",
            "fio",
            "--packet-life-time",
            "13",
            "--kernel",
            "6.12",
            "--capture",
            "/tmp/x.pcap",
            "--capture-format",
            "infiniband",
        ])
        .unwrap();
        let Cmd::Up(a) = cli.cmd else { panic!() };
        let options = cluster_options(&a).unwrap();
        let joined = options.join(" ");
        for want in [
            "--timeout 90",
            "--backend qemu",
            "--package fio",
            "--packet-life-time 13",
            "--kernel 6.12",
            "--capture /tmp/x.pcap --capture-format infiniband",
        ] {
            assert!(joined.contains(want), "{want}: {joined}");
        }
        let there = ["--config", "c.toml", "--host", "b"];
        let args: Vec<&str> = there
            .iter()
            .copied()
            .chain(options.iter().map(String::as_str))
            .collect();
        assert!(parse(&args).is_ok(), "{args:?}");
    }

    #[test]
    fn test_link_takes_a_state_two_switches_and_which_of_several_links() {
        Cli::command().debug_assert();
        assert_eq!(
            link(&["down", "leaf1", "leaf2"]).unwrap(),
            "link down leaf1 leaf2"
        );
        assert_eq!(
            link(&["up", "leaf2", "leaf1", "2"]).unwrap(),
            "link up leaf2 leaf1 2"
        );
        // A rule on the link, both ways; which of several links; back to the plan.
        assert_eq!(
            link(&["faults", "leaf1", "leaf2", "--drop", "0.01", "--delay", "200"]).unwrap(),
            "link faults leaf1 leaf2 - drop 0.01 delay 200"
        );
        assert_eq!(
            link(&[
                "faults",
                "a",
                "b",
                "2",
                "--corrupt",
                "0",
                "--delay",
                "5",
                "--jitter",
                "3"
            ])
            .unwrap(),
            "link faults a b 2 corrupt 0 delay 5 3"
        );
        assert_eq!(link(&["clear", "a", "b"]).unwrap(), "link clear a b");
        let e = link(&["faults", "a", "b"]).unwrap_err();
        assert!(e.contains("wants a rule"), "{e}");
        let e = link(&["down", "a", "b", "--drop", "0.5"]).unwrap_err();
        assert!(e.contains("not `link down`"), "{e}");
        for bad in [
            &["down", "leaf1"][..],
            &["faults", "a", "b", "--jitter", "3"],
            &["sideways", "leaf1", "leaf2"],
            &["down", "leaf1", "leaf2", "0"],
            &["down", "leaf1", "leaf2", "two"],
            &["down", "leaf1", "leaf2", "1", "2"],
        ] {
            assert!(link(bad).is_err(), "{bad:?}");
        }
        let help = Cli::command()
            .find_subcommand_mut("link")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("min-hop") && help.contains("trap 65"),
            "{help}"
        );
    }
}
