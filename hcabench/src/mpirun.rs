//! `hcabench mpirun`: an MPI job across the running cluster's guests, launched without ssh
//! through the guests' command channels (the ones `hcabench exec` uses). The launch itself
//! is [`cluster::mpi`]'s, shared with the end-to-end tests.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use cluster::mpi::{self, Job, Mpi, MpiError, Shell};

use crate::exec::{self, Channel, ExecError, Outcome, TIMED_OUT};
use crate::rundir::RunDir;

/// Run an MPI program across the cluster's guests (MPICH or Open MPI, over UCX on hcab0),
/// without ssh
///
/// MPICH (the default): its mpiexec (hydra) runs on the first node with its manual
/// launcher: it prints the command line of each node's proxy (hydra_pmi_proxy) instead of
/// starting it, and hcabench starts each one on its node through the node's command
/// channel, as `hcabench exec` does; the first node's own proxy is started beside mpiexec
/// there. Open MPI (--mpi openmpi): its mpirun runs on the first node with an rsh agent of
/// hcabench's (/tmp/hcabench-rsh, written on every node first) that prints where and what
/// to start instead of calling ssh; hcabench runs each daemon (orted) on its node the same
/// way. Either way the launcher's own connections are TCP on IPoIB (ib0); the ranks,
/// round-robin over the nodes, talk over UCX on hcab0's verbs transports
/// (UCX_NET_DEVICES=hcab0:1 unless --env sets it). Every rank's output comes here; the
/// exit status is the launcher's. A guest with no host name is named after its node.
///
/// The guests need the MPI: boot with `--package mpich` or `--package openmpi-bin` (the
/// disk then carries mpi-check, a self-checking MPI program, or mpi-check.openmpi;
/// NetPIPE's NPmpich2 with --package netpipe-mpich2, NPopenmpi with netpipe-openmpi; UCX's
/// ucx_info and ucx_perftest with --package ucx-utils), and 512 MiB each (memory_mib in
/// the cluster file). UCX_TLS picks hcab0's transports: rc_verbs,ud_verbs:aux,self (RC,
/// with UD for UCX's wire-up only) or ud_verbs,self; rc_verbs alone cannot wire up.
/// docs/guides/mpi.md has the details and measured numbers.
///
/// Examples:
///   echo 'memory_mib = 512' > mpi.toml
///   hcabench up --nodes 4 --config mpi.toml --package mpich --package netpipe-mpich2
///   hcabench mpirun -n 4 -- mpi-check
///   hcabench mpirun -n 4 --mpi openmpi -- mpi-check.openmpi
///   hcabench mpirun -n 2 --nodes node1,node3 --env UCX_TLS=ud_verbs,self -- NPmpich2 -u 65536
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct MpirunArgs {
    /// The MPI: mpich (hydra's mpiexec) or openmpi (its mpirun)
    #[arg(long, value_enum, default_value = "mpich")]
    pub mpi: MpiChoice,
    /// Ranks (processes), placed round-robin over the nodes
    #[arg(short = 'n', long = "np", value_name = "N", default_value_t = 2)]
    pub ranks: usize,
    /// The nodes, comma-separated (default: every node of the cluster); mpiexec runs on
    /// the first
    #[arg(long, value_delimiter = ',', value_name = "NODE,...")]
    pub nodes: Vec<String>,
    /// Environment for the ranks, NAME=VALUE (repeatable), e.g. UCX_TLS=ud_verbs,self
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Seconds the job may run (1 to 86400)
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = exec::timeout_secs())]
    pub timeout: u64,
    /// The program and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
}

/// The MPIs `--mpi` names.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum MpiChoice {
    Mpich,
    Openmpi,
}

/// A node's command channel as the launcher's [`Shell`].
struct Node(Channel);

impl Shell for Node {
    fn name(&self) -> &str {
        &self.0.node.name
    }

    fn stream(
        &mut self,
        cmd: &str,
        secs: u64,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<Option<u8>, Box<dyn std::error::Error + Send + Sync>> {
        match exec::run_on(&mut self.0, cmd, secs, sink)? {
            Outcome::Exited(s) => Ok(Some(s)),
            Outcome::TimedOut => Ok(None),
        }
    }
}

/// Why `mpirun` could not run the job.
#[derive(Debug, thiserror::Error)]
pub enum MpirunError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Mpi(#[from] MpiError),
    #[error("--env {0:?}: not NAME=VALUE")]
    Env(String),
}

/// `hcabench mpirun`: the exit status is mpiexec's.
pub fn main(run: &RunDir, a: &MpirunArgs) -> ExitCode {
    exec::exit_with(mpirun(run, a))
}

fn mpirun(run: &RunDir, a: &MpirunArgs) -> Result<u8, MpirunError> {
    let env = (a.env.iter())
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(MpirunError::Env(e.clone())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let state = exec::live_cluster(run)?;
    let names: Vec<String> = if a.nodes.is_empty() {
        state.nodes.iter().map(|n| n.name.clone()).collect()
    } else {
        a.nodes.clone()
    };
    let wait = Duration::from_secs(30);
    let mut nodes = Vec::new();
    for name in &names {
        nodes.push(Node(exec::open(run, &state, name, wait)?));
    }
    let job = Job {
        mpi: match a.mpi {
            MpiChoice::Mpich => Mpi::Mpich,
            MpiChoice::Openmpi => Mpi::OpenMpi,
        },
        ranks: a.ranks,
        program: a.program.clone(),
        env,
        secs: a.timeout,
    };
    let mut stdout = std::io::stdout();
    let outcome = mpi::run(&mut nodes, &job, &mut |line| {
        let _ = writeln!(stdout, "{line}");
    })?;
    Ok(match outcome.status {
        Some(s) => s,
        None => {
            eprintln!(
                "hcabench: the MPI job ran past its {} s limit and was killed (--timeout)",
                a.timeout
            );
            TIMED_OUT
        }
    })
}
