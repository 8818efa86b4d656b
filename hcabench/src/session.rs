//! How `run <app>` and the benches get their guests: the cluster file and flags, resolved to
//! a launcher spec (`cluster::ClusterSpec`) on the backend they choose, booted with progress
//! lines in a directory of the command's own; the cluster's capture and fault plan go on the
//! fabric when the measured work starts, and the plan's node kills are carried out while it
//! runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cluster::agent::Agent;
use cluster::verbs::Testbed;
use cluster::{Backend, ClusterSpec};
use hca_model::faults::FaultHook;

use crate::config::ClusterConfig;

/// What a command boots, beyond the cluster file.
pub struct Shape {
    /// Names the scratch directory (`hcabench-<what>-<pid>`).
    pub what: &'static str,
    pub nodes: usize,
    /// A virtio-net link between two QEMU guests, for SoftRoCE.
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
    ) -> Result<Session, String> {
        let image = cfg.image()?;
        let dir: PathBuf =
            std::env::temp_dir().join(format!("hcabench-{}-{}", shape.what, std::process::id()));
        let spec = ClusterSpec {
            link: shape.link,
            ..cfg.spec(backend, image, dir.clone(), shape.nodes)
        };
        let mut tb = Testbed::boot(&spec, boot_timeout, progress).map_err(|e| match backend {
            Backend::Kvm => cluster::backend::kvm_boot_advice(&e.to_string(), boot_timeout),
            Backend::Qemu => e.to_string(),
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
    pub fn start_fabric_tools(&mut self) -> Result<(), String> {
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
    pub fn with_kills<T: Send, E: Into<String> + Send>(
        &mut self,
        work: impl FnOnce(&mut [Agent]) -> Result<T, E> + Send,
    ) -> Result<T, String> {
        let Some(hook) = &self.faults else {
            return work(&mut self.tb.agents).map_err(Into::into);
        };
        let (agents, cluster) = (&mut self.tb.agents, &mut self.tb.cluster);
        std::thread::scope(|s| {
            let job = s.spawn(|| work(agents));
            while !job.is_finished() {
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
pub fn refuse_node_kills(cfg: &ClusterConfig, command: &str) -> Result<(), String> {
    if let Some(f) = &cfg.faults {
        if !crate::faultrun::load_plan(f)?.nodes.is_empty() {
            return Err(format!(
                "{}: {command} measures every node of its cluster, so a plan with node kills \
                 does not apply (`hcabench up --faults` and `hcabench run` carry them out)",
                f.display()
            ));
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
