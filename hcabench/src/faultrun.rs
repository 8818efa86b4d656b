//! A cluster under a fault plan (`hcabench up --faults plan.toml`): the plan's hooks on the
//! cluster's fabric and HCAs, its decisions logged to `faults.jsonl` in the run directory,
//! and at the end a short report (`faults.report`: faults injected by kind, retransmissions
//! and error completions the HCAs counted, the seed) that `hcabench down` prints. Also the
//! fabric capture (`--capture`), which rides on the same fabric.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hca_model::capture::Capture;
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::{Fabric, Hca};

use crate::rundir::RunDir;

pub const LOG: &str = "faults.jsonl";
pub const REPORT: &str = "faults.report";

/// Why a plan or a capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum FaultRunError {
    #[error("cannot read fault plan {}: {source}", .path.display())]
    ReadPlan { path: PathBuf, source: io::Error },
    /// The plan did not parse, or a rule is out of range.
    #[error("fault plan {}: {source}", .path.display())]
    BadPlan {
        path: PathBuf,
        /// Boxed: a TOML error is large, and this one is rare.
        source: Box<hca_model::faults::PlanError>,
    },
    /// A `[[link]]` rule's `switch_link` past the cluster's `[[link]]` tables.
    #[error(
        "fault plan {}: [[link]] {rule} names switch_link = {n}, but the cluster has {have} \
         inter-switch link(s) ([[link]] in the cluster file, counted from 1)",
        .path.display()
    )]
    NoSuchSwitchLink {
        path: PathBuf,
        rule: usize,
        n: u16,
        have: usize,
    },
    #[error("cannot open {}: {source}", .path.display())]
    OpenLog { path: PathBuf, source: io::Error },
    #[error("cannot create capture {}: {source}", .path.display())]
    Capture { path: PathBuf, source: io::Error },
}

/// Reads and checks a plan file.
pub fn load_plan(path: &Path) -> Result<FaultPlan, FaultRunError> {
    let text = std::fs::read_to_string(path).map_err(|source| FaultRunError::ReadPlan {
        path: path.to_path_buf(),
        source,
    })?;
    FaultPlan::parse(&text).map_err(|e| FaultRunError::BadPlan {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// Checks that every inter-switch link `plan` (read from `path`) names is one of the
/// cluster's `have`.
pub fn check_switch_links(plan: &FaultPlan, have: usize, path: &Path) -> Result<(), FaultRunError> {
    let past = (plan.links.iter().enumerate()).find_map(|(i, l)| {
        l.switch_link
            .filter(|&n| usize::from(n) > have)
            .map(|n| (i, n))
    });
    match past {
        Some((i, n)) => Err(FaultRunError::NoSuchSwitchLink {
            path: path.to_path_buf(),
            rule: i + 1,
            n,
            have,
        }),
        None => Ok(()),
    }
}

/// Puts the plan at `path` on `fabric`, logging its decisions to `log_path`.
pub fn attach(
    log_path: &Path,
    path: &Path,
    fabric: &Fabric,
) -> Result<Arc<FaultHook>, FaultRunError> {
    let plan = load_plan(path)?;
    check_switch_links(&plan, fabric.subnet().topology().links().len(), path)?;
    let hook = start(log_path, plan, fabric)?;
    eprintln!(
        "fault plan {} (seed {}), decisions in {}",
        path.display(),
        hook.seed(),
        log_path.display()
    );
    Ok(hook)
}

/// Starts `plan` now on `fabric`'s links and HCAs, logging to `log_path` (appended to: live
/// changes may start a plan on a cluster that already logged one).
pub fn start(
    log_path: &Path,
    plan: FaultPlan,
    fabric: &Fabric,
) -> Result<Arc<FaultHook>, FaultRunError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(|source| FaultRunError::OpenLog {
            path: log_path.to_path_buf(),
            source,
        })?;
    let hook = Arc::new(FaultHook::new(
        plan,
        Some(Box::new(std::io::LineWriter::new(log))),
    ));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    fabric.set_adapter_hook(Some(hook.clone()));
    Ok(hook)
}

/// Writes every packet on `fabric` to the pcap file `path`.
pub fn attach_capture(
    path: &Path,
    format: crate::config::CaptureFormat,
    fabric: &Fabric,
) -> Result<Arc<Capture>, FaultRunError> {
    let err = |source| FaultRunError::Capture {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(err)?;
    let cap = Capture::new(
        Box::new(std::io::BufWriter::new(file)),
        format.model(),
        fabric.now_ns(),
    )
    .map_err(err)?;
    let cap = Arc::new(cap);
    fabric.set_tap(Some(cap.clone()));
    eprintln!(
        "capturing fabric packets to {} ({format:?})",
        path.display()
    );
    Ok(cap)
}

/// Ends the plan's run: its log flushed, and the report for `hook` over the cluster's
/// `hcas`.
pub fn report(hook: &FaultHook, hcas: &[Hca]) -> String {
    hook.flush();
    let c = hook.counts();
    let mut s = format!(
        "fault plan report (seed {})\n  faults injected: {} (link down {}, dropped {}, \
         duplicated {}, reordered {}, corrupted {}, delayed {}, nodes killed {}, packets \
         to or from dead nodes {})\n  adapter faults: {} (WQE errors {}, doorbells lost {}, \
         interrupts lost {}, interrupts late {}, CQ overflows {}, catastrophic errors {}, resets \
         underneath the driver {}, hot-unplugs {})\n",
        hook.seed(),
        c.total(),
        c.link_down,
        c.dropped,
        c.duplicated,
        c.reordered,
        c.corrupted,
        c.delayed,
        c.nodes_killed,
        c.node_dead,
        c.adapter(),
        c.wqe_errors,
        c.doorbells_lost,
        c.interrupts_lost,
        c.interrupts_late,
        c.cq_overflows,
        c.adapters_fatal,
        c.adapters_reset,
        c.adapters_unplugged
    );
    let mut sum = hca_model::HcaStats::default();
    for h in hcas {
        let st = h.stats();
        sum.retransmits += st.retransmits;
        sum.seq_naks += st.seq_naks;
        sum.read_gaps += st.read_gaps;
        sum.rnr_naks += st.rnr_naks;
        sum.retry_exceeded += st.retry_exceeded;
        sum.duplicates += st.duplicates;
        sum.icrc_errors += st.icrc_errors;
    }
    s += &format!(
        "  transport: {} packets resent, {} sequence NAKs, {} read response gaps, {} RNR \
         NAKs, {} duplicates answered, {} bad ICRCs dropped\n  error completions (retries exhausted or peer unreachable): {}\n",
        sum.retransmits,
        sum.seq_naks,
        sum.read_gaps,
        sum.rnr_naks,
        sum.duplicates,
        sum.icrc_errors,
        sum.retry_exceeded
    );
    s
}

/// Writes the report into the run directory (and to the daemon's log).
pub fn finish(run: &RunDir, hook: &FaultHook, hcas: &[Hca]) {
    let r = report(hook, hcas);
    eprint!("{r}");
    if let Err(e) = std::fs::write(run.path(REPORT), &r) {
        eprintln!("daemon: cannot write {}: {e}", run.path(REPORT).display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_plan_naming_an_inter_switch_link_the_cluster_lacks_is_refused_by_number() {
        let plan = FaultPlan::parse(
            "[[link]]\nlid = 1\ndrop = 0.1\n[[link]]\nswitch_link = 3\ndrop = 0.1\n",
        )
        .unwrap();
        let path = Path::new("plan.toml");
        assert!(check_switch_links(&plan, 3, path).is_ok());
        let e = check_switch_links(&plan, 2, path).unwrap_err().to_string();
        assert!(
            e.contains("[[link]] 2 names switch_link = 3, but the cluster has 2"),
            "{e}"
        );
    }
}
