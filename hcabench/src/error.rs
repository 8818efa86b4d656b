//! The command line's errors: [`Error`], what `main` prints (with its causes) when a command
//! fails, and [`UsageError`], a request the command refuses before it starts anything. Each
//! module has its own enum beside its code (`CopyError`, `ExecError`, `BenchError`, ...);
//! `Error` gathers them, and says what to do where the module's error cannot know.

use std::path::PathBuf;
use std::time::Duration;

use cluster::{BackendError, ImageError};
use hcabench::config::{ConfigError, Invalid};

use crate::console::ConsoleError;
use crate::control::ControlError;
use crate::copy::CopyError;
use crate::daemon::DaemonError;
use crate::exec::ExecError;
use crate::faultrun::FaultRunError;
use crate::session::BenchError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "a cluster of {nodes} nodes is already up in {} (`hcabench down` stops it)",
        .dir.display()
    )]
    AlreadyUp { nodes: usize, dir: PathBuf },
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A path given on the command line.
    #[error("{}: {source}", .path.display())]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no directory {}", .path.display(), .dir.display())]
    NoDir { path: PathBuf, dir: PathBuf },
    #[error("the cluster file could not be written: {0}")]
    Serialize(#[from] toml::ser::Error),
    #[error("cannot start the daemon: {0}")]
    Spawn(#[source] std::io::Error),
    /// The daemon exited, or wrote no state in time; its log.
    #[error("the cluster did not start:\n{0}")]
    NotStarted(String),
    #[error("{node}: {source}")]
    NotReady { node: String, source: BootWait },
    /// A guest under hcabench's VMM did not reach userspace: what happened and what to do.
    #[error(
        "{}",
        cluster::backend::kvm_boot_advice(&format!("{node}: {source}"), *timeout)
    )]
    KvmBoot {
        node: String,
        source: BootWait,
        timeout: Duration,
    },
    #[error("daemon {0} did not stop within 20 s: `kill {0}` stops it")]
    DaemonStuck(u32),
    #[error("no node `{node}` in this cluster (node1 to node{nodes})")]
    NoNode { node: String, nodes: usize },
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error(transparent)]
    Faults(#[from] FaultRunError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Console(#[from] ConsoleError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Copy(#[from] CopyError),
    /// Boxed: a bench's error carries its guests' words, and `Error` travels in every
    /// command's `Result`.
    #[error(transparent)]
    Bench(Box<BenchError>),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

impl From<BenchError> for Error {
    fn from(e: BenchError) -> Self {
        Error::Bench(Box::new(e))
    }
}

/// Why a guest `hcabench up` waits for never got ready; each with its console so far.
#[derive(Debug, thiserror::Error)]
pub enum BootWait {
    #[error("its VMM exited; console:\n{0}")]
    Exited(String),
    #[error("the guest stopped; console:\n{0}")]
    Stopped(String),
    #[error("not ready in time; console so far:\n{0}")]
    Late(String),
}

/// A request a command refuses before it starts: what to change.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// A cluster file with `[[host]]` tables, started without saying which host this is.
    #[error(
        "this cluster spans hosts ({0}): start it on each with `hcabench up --config FILE \
         --host NAME`"
    )]
    WhichHost(String),
    /// `--host NAME` names no `[[host]]` table of the cluster file.
    #[error("the cluster file has no [[host]] named {name:?} (it has: {hosts})")]
    NoSuchHost { name: String, hosts: String },
    /// A run or a bench on a cluster file that spans hosts.
    #[error(
        "{0} boots its guests on this host alone, and this cluster file spans hosts ([[host]]): \
         start it with `hcabench up --host NAME` on each and run work through the guests \
         (hcabench exec), or drop the [[host]] tables"
    )]
    HostsNotHere(String),
    /// `--host` on a cluster file with no `[[host]]` tables.
    #[error("--host {0}: the cluster file names no hosts (add [[host]] tables)")]
    NoHosts(String),
    /// `what` (a flag, or what it sets) is `value`, outside `range`.
    #[error("{what} {value} is outside {range}")]
    OutOfRange {
        what: &'static str,
        value: u64,
        range: &'static str,
    },
    #[error("{0} needs at least one value")]
    Empty(&'static str),
    #[error(
        "`hcabench link faults` wants a rule: --drop, --duplicate, --reorder, --corrupt or \
         --delay (see `hcabench link --help`)"
    )]
    LinkRule,
    #[error(
        "--drop, --duplicate, --reorder, --corrupt, --delay and --jitter go with `hcabench \
         link faults`, not `link {0}`"
    )]
    LinkRuleWith(&'static str),
    #[error("expected NODE=SYSFS_PATH, e.g. node1=/sys/bus/pci/devices/0000:03:00.0")]
    Vfio,
    #[error("P_Key `{0}`: want a number to 0xffff, e.g. 0x8001")]
    PKey(String),
    #[error("--vfio needs the kvm backend; the backend is qemu ({why})")]
    VfioNeedsKvm { why: String },
    #[error(
        "bench vmm compares both backends (hcabench's VMM and QEMU/KVM); --backend does not \
         apply"
    )]
    VmmBackend,
    #[error(
        "--bw-bytes {bytes} is outside 1 MiB..={most} MiB (a quarter of the smaller guest's \
         {guest_mib} MiB)"
    )]
    NfsBytes {
        bytes: u64,
        most: u64,
        guest_mib: u64,
    },
    #[error("--apps, --app-nodes, --threads and --modes need a value each")]
    AppsNeedValues,
    /// `probe` asked for where a DSM application is wanted.
    #[error("{0} is not a DSM application")]
    NotAnApp(String),
    #[error("probe runs on the cluster `up` boots, not as a DSM application")]
    Probe,
    #[error("--faults and --capture act on hcabench's fabric, not on SoftRoCE's network")]
    RxeFabricTools,
    #[error("application argument `{0}` is not a number")]
    AppArg(String),
    #[error(
        "{}: {command} measures every node of its cluster, so a plan with node kills does \
         not apply (`hcabench up --faults` and `hcabench run` carry them out)",
        .plan.display()
    )]
    NodeKills { plan: PathBuf, command: String },
}

/// `e` and its causes, one after another (`e: cause: cause`), each said once: a cause whose
/// words its effect's message already carries adds nothing.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_cause_is_added_to_the_message_once() {
        let io = || std::io::Error::other("disk on fire");
        let quoted = Error::Spawn(io());
        assert_eq!(chain(&quoted), "cannot start the daemon: disk on fire");
        #[derive(Debug, thiserror::Error)]
        #[error("reading the plan")]
        struct Terse(#[source] std::io::Error);
        assert_eq!(chain(&Terse(io())), "reading the plan: disk on fire");
    }

    #[test]
    fn test_no_cluster_says_how_to_start_one() {
        let e = Error::from(ExecError::NoCluster(PathBuf::from("/run/hcabench")));
        assert_eq!(
            e.to_string(),
            "no cluster is up in /run/hcabench: start one with `hcabench up`"
        );
    }
}
