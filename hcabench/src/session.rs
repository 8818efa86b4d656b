//! How `run <app>` and the benches get their guests: the cluster file and flags, resolved to
//! a launcher spec (`cluster::ClusterSpec`) on the backend they choose, booted with progress
//! lines in a directory of the command's own; the cluster's capture and fault plan go on the
//! fabric when the measured work starts, and the plan's node kills are carried out while it
//! runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster::agent::{Agent, AgentError};
use cluster::dsm::{DsmError, SettleError};
use cluster::node::WaitError;
use cluster::verbs::{AnswerError, Testbed, VerbsError};
use cluster::{Backend, BackendError, ClusterSpec, ImageError};
use hca_model::faults::{AdapterEvent, FaultHook};

use crate::config::ClusterConfig;
use crate::error::UsageError;
use crate::faultrun::FaultRunError;

/// Why a bench or `hcabench run` did not boot its guests, or its work on them failed or
/// gave figures that cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Guests under hcabench's VMM did not boot: what happened and what to do.
    #[error("{}", cluster::backend::kvm_boot_advice(&.source.to_string(), *.timeout))]
    KvmBoot {
        source: Box<VerbsError>,
        timeout: Duration,
    },
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Wait(#[from] WaitError),
    #[error(transparent)]
    Shell(#[from] AgentError),
    #[error(transparent)]
    Answer(#[from] AnswerError),
    #[error(transparent)]
    Dsm(#[from] DsmError),
    #[error(transparent)]
    Settle(#[from] SettleError),
    #[error(transparent)]
    Faults(#[from] FaultRunError),
    #[error(
        "bench vmm compares two KVM hosts, and KVM cannot run Linux here ({0}); \
         ci/nested-kvm.sh runs it inside a nested KVM"
    )]
    NoKvm(String),
    /// A failure after the fault plan killed a node, which the DSM cannot survive.
    #[error(
        "{0}\n(the fault plan killed a node: the DSM cannot go on without one, so its peers' \
         faults and calls fail)"
    )]
    NodeKilled(#[source] Box<BenchError>),
    #[error("{0} data errors: the numbers above are not trustworthy")]
    DataErrors(u64),
    /// `what` (device, mode, size) completed `done` of `iters` round trips.
    #[error("{what}: {done} of {iters} round trips")]
    RoundTrips { what: String, done: u64, iters: u64 },
    #[error("{what}: {done} of {iters} round trips, {errors} data errors")]
    VmmRoundTrips {
        what: String,
        done: u64,
        iters: u64,
        errors: u64,
    },
    #[error("kernel ping-pong: {done} of {iters} done, {errors} errors")]
    KernelPing { done: u64, iters: u64, errors: u64 },
    #[error("no node 2")]
    NoNode2,
    #[error("dsm-bench printed no result:\n{0}")]
    DsmBenchSilent(String),
    #[error("dsm-bench saw wrong page contents: {0}")]
    WrongPages(String),
    /// The DSM's counters show it ran otherwise than configured (`what`).
    #[error("{what}: {stats}")]
    Configured { what: &'static str, stats: String },
    #[error("{node}: the load did not start: {output}")]
    NoLoad { node: String, output: String },
    /// `what` (an application run) gave a result other than the sequential run's.
    #[error("{0}: the result differs from the sequential run")]
    Differs(String),
    #[error("{0}: no node verified the result")]
    Unverified(String),
    #[error("{failed} of {total} runs failed:\n{}", .failures.join("\n"))]
    Runs {
        failed: usize,
        total: usize,
        failures: Vec<String>,
    },
    #[error("{dev}: `{cmd}` gave no result row:\n{output}\nserver:\n{server}")]
    NoRow {
        dev: String,
        cmd: String,
        output: String,
        server: String,
    },
    #[error("{name}: no timing in `{output}`")]
    NoTiming { name: String, output: String },
    /// What came back is not what was sent (`what`: the file, the transfer).
    #[error("{name}: {what} changed: {output}")]
    Changed {
        name: String,
        what: &'static str,
        output: String,
    },
    #[error("{name}: no ping answered: {output}")]
    NoPing { name: String, output: String },
    #[error("{name}: no ping summary in `{output}`")]
    NoPingSummary { name: String, output: String },
    #[error("the NFS server did not start: {0}")]
    NfsServer(String),
    #[error("{name}: the mount is not over {via}: {output}")]
    NfsMount {
        name: String,
        via: String,
        output: String,
    },
}

/// What a command boots, beyond the cluster file.
pub struct Shape {
    /// Names the scratch directory (`hcabench-<what>-<pid>`).
    pub what: &'static str,
    pub nodes: usize,
    /// A virtio-net NIC in every QEMU guest, on one Ethernet segment, for SoftRoCE.
    pub link: bool,
}

/// A booted testbed and the fabric tools the cluster file asked for.
pub struct Session {
    pub tb: Testbed,
    cfg: ClusterConfig,
    faults: Option<Arc<FaultHook>>,
}

impl Session {
    /// Boots `shape` on `backend` with the guests the cluster file describes (memory, vCPUs,
    /// kernel arguments, image), every guest under agent control.
    pub fn boot(
        cfg: &ClusterConfig,
        backend: Backend,
        shape: Shape,
        boot_timeout: Duration,
        keep: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Session, BenchError> {
        if !cfg.host.is_empty() {
            // A run or a bench boots its guests on this host alone.
            return Err(UsageError::HostsNotHere(shape.what.to_string()).into());
        }
        let image = cfg.image()?;
        let dir: PathBuf =
            std::env::temp_dir().join(format!("hcabench-{}-{}", shape.what, std::process::id()));
        let spec = ClusterSpec {
            link: shape.link,
            ..cfg.spec(backend, image, dir.clone(), shape.nodes)
        };
        let mut tb = Testbed::boot(&spec, boot_timeout, progress).map_err(|e| match backend {
            Backend::Kvm => BenchError::KvmBoot {
                source: Box::new(e),
                timeout: boot_timeout,
            },
            Backend::Qemu => BenchError::Verbs(e),
        })?;
        if keep {
            tb.keep_dir();
            progress(&format!("keeping {} (consoles)", dir.display()));
        }
        Ok(Session {
            tb,
            cfg: cfg.clone(),
            faults: None,
        })
    }

    /// Starts the cluster file's capture and fault plan on the fabric now (boot and set-up
    /// run clean). The plan's log stays in the session's directory.
    pub fn start_fabric_tools(&mut self) -> Result<(), BenchError> {
        let fabric = self.tb.fabric().clone();
        if let Some(plan) = &self.cfg.faults {
            self.tb.keep_dir();
            let log = self.tb.dir.join(crate::faultrun::LOG);
            self.faults = Some(crate::faultrun::attach(&log, plan, &fabric)?);
        }
        if let Some(path) = &self.cfg.capture {
            crate::faultrun::attach_capture(path, self.cfg.capture_format, &fabric)?;
        }
        Ok(())
    }

    pub fn faults(&self) -> Option<&Arc<FaultHook>> {
        self.faults.as_ref()
    }

    /// Prints the fault plan's report, if a plan ran.
    pub fn print_fault_report(&self) {
        if let Some(h) = &self.faults {
            print!("{}", crate::faultrun::report(h, &self.tb.cluster.hcas()));
        }
    }

    /// Runs `work` on the guests' shells while carrying out the plan's node kills (polled
    /// every 100 ms on this thread while `work` runs on another). A killed node's guest
    /// stops and its HCA leaves the fabric, so its peers' work requests fail.
    pub fn with_kills<T: Send, E: Into<BenchError> + Send>(
        &mut self,
        work: impl FnOnce(&mut [Agent]) -> Result<T, E> + Send,
    ) -> Result<T, BenchError> {
        let Some(hook) = &self.faults else {
            return work(&mut self.tb.agents).map_err(Into::into);
        };
        let (agents, cluster) = (&mut self.tb.agents, &mut self.tb.cluster);
        std::thread::scope(|s| {
            let job = s.spawn(|| work(agents));
            while !job.is_finished() {
                for (lid, event) in hook.due_adapter_events(cluster.fabric().now_ns()) {
                    let i = usize::from(lid).wrapping_sub(1);
                    let done = match event {
                        AdapterEvent::Fault(f) => cluster
                            .fabric()
                            .adapter_fault(lid, f)
                            .is_some()
                            .then_some(()),
                        AdapterEvent::Unplug | AdapterEvent::Replug if i < cluster.len() => {
                            let node = cluster.node_mut(i);
                            let r = if event == AdapterEvent::Unplug {
                                node.unplug_hca()
                            } else {
                                node.replug_hca()
                            };
                            r.map_err(|e| println!("  the plan's {}: {e}", event.name()))
                                .ok()
                        }
                        _ => None,
                    };
                    if done.is_some() {
                        println!("  node{lid}'s adapter: {}, by the fault plan", event.name());
                    }
                }
                for lid in hook.due_kills(cluster.fabric().now_ns()) {
                    let i = usize::from(lid).wrapping_sub(1);
                    if cluster.kill(i) {
                        println!("  node{lid} killed by the fault plan");
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            job.join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
                .map_err(Into::into)
        })
    }
}

/// Refuses a fault plan with node kills where a command cannot carry them out.
pub fn refuse_node_kills(cfg: &ClusterConfig, command: &str) -> Result<(), BenchError> {
    if let Some(f) = &cfg.faults {
        if !crate::faultrun::load_plan(f)?.nodes.is_empty() {
            return Err(UsageError::NodeKills {
                plan: f.clone(),
                command: command.to_string(),
            }
            .into());
        }
    }
    Ok(())
}

/// The command-line name of a value enum's variant (`Job::Sor` is "sor").
pub fn value_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
