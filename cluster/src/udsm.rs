//! The user-level DSM's runs: libdsm's `udsm.c` runs the DSM protocol in the application's
//! own process over libibverbs (`DSM_MODE=user`, or `user-poll` for a service thread that
//! polls its CQ), without the kernel module. Its processes connect their RC QPs through a
//! rendezvous in a directory of every guest ([`DIR`]), which the harness completes through
//! the guests' shells, so no IP network is needed:
//!
//! 1. every node starts the application in the background; it creates its QPs and writes
//!    `addr` (LID, PSN, GID and its QP number for each peer), which the harness reads;
//! 2. the harness writes every node's line into every node's `peers`; each process brings
//!    its QPs to RTS and writes `ready`;
//! 3. once every node is ready the harness writes `go` everywhere (nothing is then sent to a
//!    QP not yet able to receive), and waits for each process's exit status (`rc`) and
//!    output (`out`).
//!
//! The processes time out (`DSM_TIMEOUT`) on a step that never comes, and the harness
//! kills them when a step fails on any node.

use std::time::Duration;

use crate::agent::{Agent, AgentError};
use crate::dsm::{result_of, AppResult, DsmError};
use crate::verbs::AnswerError;

/// The rendezvous directory in every guest (libdsm's default `DSM_DIR`).
pub const DIR: &str = "/tmp/udsm";

/// How long a process waits for a rendezvous step, and the harness for its answers.
const STEP: Duration = Duration::from_secs(60);

/// The user-level protocol's service thread: waiting on a completion channel, or polling.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Service {
    Channel,
    Poll,
}

impl Service {
    /// libdsm's `DSM_MODE`.
    pub fn dsm_mode(self) -> &'static str {
        match self {
            Service::Channel => "user",
            Service::Poll => "user-poll",
        }
    }
}

/// A shell loop that waits (at most `STEP`) for `file` in [`DIR`], or for the process's exit.
fn wait_for(file: &str) -> String {
    let tries = STEP.as_millis() / 50;
    format!(
        "i=0; while [ ! -e {DIR}/{file} ] && [ ! -e {DIR}/rc ] && [ $i -lt {tries} ]; do \
         sleep 0.05; i=$((i+1)); done; [ -e {DIR}/{file} ]"
    )
}

/// Node `node` of `nodes`: a fresh [`DIR`], the application (`cmd`, from
/// [`crate::dsm::app_command`]) started in the background, and its address line once written.
/// `run` bounds each of the process's own waits: a barrier lasts the slowest node's whole
/// phase, and the exit barrier node 1's sequential run and check.
pub fn start_command(
    cmd: &str,
    node: usize,
    nodes: usize,
    dev: &str,
    service: Service,
    run: Duration,
) -> String {
    let env = format!(
        "DSM_MODE={} DSM_NODE={node} DSM_NODES={nodes} DSM_DEV={dev} DSM_DIR={DIR} \
         DSM_TIMEOUT={}",
        service.dsm_mode(),
        run.as_secs().max(STEP.as_secs())
    );
    format!(
        "rm -rf {DIR}; mkdir -p {DIR}; ({env} {cmd} </dev/null >{DIR}/out 2>&1 & \
         echo $! >{DIR}/pid; wait $!; echo $? >{DIR}/rc.tmp; mv {DIR}/rc.tmp {DIR}/rc) \
         </dev/null >/dev/null 2>&1 &\n{} && cat {DIR}/addr || {{ echo 'no address line'; \
         cat {DIR}/out; false; }}",
        wait_for("addr")
    )
}

/// Whether a guest's address line is one this module may echo back into a shell command:
/// `key=value` words of letters, digits and commas only.
pub fn address_ok(line: &str) -> bool {
    line.starts_with("node=")
        && line.len() < 400
        && line
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '=' | ',' | ' '))
}

/// Writes every node's address line into a node's `peers` (whole, by rename).
pub fn peers_command(lines: &[String]) -> String {
    let quoted: Vec<String> = lines.iter().map(|l| format!("'{l}'")).collect();
    format!(
        "printf '%s\\n' {} >{DIR}/peers.tmp && mv {DIR}/peers.tmp {DIR}/peers",
        quoted.join(" ")
    )
}

/// Waits (at most `run`) for the process's exit; prints its output and exits with its
/// status, or kills it when it has not exited by then, so the agent's shell is free again.
fn finish_command(run: Duration) -> String {
    let tries = run.as_millis() / 50;
    format!(
        "i=0; while [ ! -e {DIR}/rc ] && [ $i -lt {tries} ]; do sleep 0.05; i=$((i+1)); done; \
         [ -e {DIR}/rc ] || {{ kill $(cat {DIR}/pid) 2>/dev/null; cat {DIR}/out; \
         echo 'the user-level DSM did not finish in {}s: killed'; false; }} && \
         cat {DIR}/out && (exit $(cat {DIR}/rc))",
        run.as_secs()
    )
}

/// Runs one command per agent at once (`cmds[i]` on agent `i`).
fn run_each(
    agents: &mut [Agent],
    cmds: &[String],
    timeout: Duration,
) -> Vec<Result<(i32, String), AgentError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = agents
            .iter_mut()
            .zip(cmds)
            .map(|(a, c)| s.spawn(move || a.status(c, timeout)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Every node's answer to one step; the first failure (naming the node) otherwise.
fn step(
    agents: &mut [Agent],
    cmds: &[String],
    timeout: Duration,
    what: &str,
) -> Result<Vec<String>, DsmError> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let mut out = Vec::new();
    for (name, r) in names.iter().zip(run_each(agents, cmds, timeout)) {
        let (rc, text) = r?;
        if rc != 0 {
            return Err(DsmError::Exited {
                node: name.clone(),
                cmd: what.to_string(),
                status: rc,
                output: text,
            });
        }
        out.push(text);
    }
    Ok(out)
}

/// Runs the DSM application `cmd` on every node with the user-level DSM on `dev`; each
/// node's result, as [`crate::dsm::run_app`] gives the kernel DSM's.
pub fn run_app_user(
    agents: &mut [Agent],
    cmd: &str,
    dev: &str,
    service: Service,
    timeout: Duration,
) -> Result<Vec<AppResult>, DsmError> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let ends = run_user(agents, cmd, dev, service, timeout)?;
    let mut out = Vec::new();
    for (name, (rc, text)) in names.iter().zip(&ends) {
        match result_of(name, cmd, *rc, text.clone()) {
            Ok(res) => out.push(res),
            Err(cause) => {
                return Err(DsmError::Failed {
                    cause: Box::new(cause),
                    state: every_output(&names, &ends),
                    stalled: Vec::new(),
                })
            }
        }
    }
    Ok(out)
}

/// Runs a program linked with libdsm (`cmd`) on every node with the user-level DSM on
/// `dev`; each node's output, every node having exited 0.
pub fn run_user_ok(
    agents: &mut [Agent],
    cmd: &str,
    dev: &str,
    service: Service,
    timeout: Duration,
) -> Result<Vec<String>, DsmError> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let ends = run_user(agents, cmd, dev, service, timeout)?;
    if let Some((name, (rc, text))) = names.iter().zip(&ends).find(|(_, (rc, _))| *rc != 0) {
        return Err(DsmError::Failed {
            cause: Box::new(DsmError::Exited {
                node: name.clone(),
                cmd: cmd.to_string(),
                status: *rc,
                output: text.clone(),
            }),
            state: every_output(&names, &ends),
            stalled: Vec::new(),
        });
    }
    Ok(ends.into_iter().map(|(_, text)| text).collect())
}

/// Every node's exit status and output, for a failure's report: the cause of one node's
/// failure is often on another.
fn every_output(names: &[String], ends: &[(i32, String)]) -> String {
    names
        .iter()
        .zip(ends)
        .map(|(name, (rc, text))| format!("== {name} (exit {rc}) ==\n{}\n", text.trim_end()))
        .collect()
}

/// The rendezvous and the run; each node's exit status and output.
fn run_user(
    agents: &mut [Agent],
    cmd: &str,
    dev: &str,
    service: Service,
    timeout: Duration,
) -> Result<Vec<(i32, String)>, DsmError> {
    let res = rendezvous_and_run(agents, cmd, dev, service, timeout);
    if res.is_err() {
        // No process stays behind to wait for a peer that is gone (best effort).
        let kill = format!("[ -e {DIR}/rc ] || kill $(cat {DIR}/pid) 2>/dev/null; true");
        let _ = run_each(agents, &vec![kill; agents.len()], Duration::from_secs(10));
    }
    res
}

fn rendezvous_and_run(
    agents: &mut [Agent],
    cmd: &str,
    dev: &str,
    service: Service,
    timeout: Duration,
) -> Result<Vec<(i32, String)>, DsmError> {
    let n = agents.len();
    let slack = STEP + Duration::from_secs(30);
    let starts: Vec<String> = (1..=n)
        .map(|i| start_command(cmd, i, n, dev, service, timeout))
        .collect();
    let outs = step(agents, &starts, slack, &format!("{cmd} (its address)"))?;
    let mut lines = Vec::new();
    for (i, (a, out)) in agents.iter().zip(&outs).enumerate() {
        // Each node's own line, so that no node's peers file names one node twice.
        let own = format!("node={} ", i + 1);
        let line = out
            .lines()
            .find(|l| address_ok(l) && l.starts_with(&own))
            .ok_or_else(|| AnswerError::NoLine {
                node: a.name.clone(),
                what: format!("the user-level DSM's address ({DIR}/addr)"),
                output: out.clone(),
            })?;
        lines.push(line.to_string());
    }
    step(
        agents,
        &vec![peers_command(&lines); n],
        slack,
        "writing peers",
    )?;
    let ready = format!(
        "{} || {{ echo 'not ready'; cat {DIR}/out; false; }}",
        wait_for("ready")
    );
    step(
        agents,
        &vec![ready; n],
        slack,
        &format!("{cmd} (connecting)"),
    )?;
    step(agents, &vec![format!("echo go >{DIR}/go"); n], slack, "go")?;
    let mut ends = Vec::new();
    // The agents wait a little longer than the guests' own bound, which kills the process.
    let finish = finish_command(timeout);
    for r in run_each(agents, &vec![finish; n], timeout + Duration::from_secs(15)) {
        ends.push(r?);
    }
    Ok(ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_start_command_sets_the_node_and_mode_and_waits_for_the_address() {
        let run = Duration::from_secs(600);
        let c = start_command("DSM_THREADS=2 sor 34", 3, 4, "hcab0", Service::Poll, run);
        assert!(c.contains("DSM_MODE=user-poll DSM_NODE=3 DSM_NODES=4 DSM_DEV=hcab0"));
        // The process's waits are bounded by the run's time, not by one rendezvous step.
        assert!(c.contains("DSM_TIMEOUT=600"));
        assert!(c.contains("DSM_THREADS=2 sor 34 </dev/null"));
        assert!(c.contains(&format!("[ ! -e {DIR}/addr ]")));
        // The agent's shell must not wait for the background process's output.
        assert!(c.contains(") </dev/null >/dev/null 2>&1 &"));
    }

    #[test]
    fn test_address_lines_with_shell_characters_are_refused() {
        let good = "node=1 lid=1 psn=123 gid=fe800000000000000000000000000001 qpns=0,17";
        assert!(address_ok(good));
        assert!(!address_ok("node=1 lid=1'; reboot; '"));
        assert!(!address_ok("node=1 $(reboot)"));
        assert!(!address_ok("lid=1 node=1"));
    }

    #[test]
    fn test_peers_command_writes_every_line_by_rename() {
        let c = peers_command(&["node=1 lid=1".into(), "node=2 lid=2".into()]);
        assert_eq!(
            c,
            format!(
                "printf '%s\\n' 'node=1 lid=1' 'node=2 lid=2' >{DIR}/peers.tmp && \
                 mv {DIR}/peers.tmp {DIR}/peers"
            )
        );
    }

    #[test]
    fn test_finish_command_exits_with_the_process_status_without_leaving_the_shell() {
        let c = finish_command(Duration::from_secs(2));
        assert!(c.ends_with(&format!("(exit $(cat {DIR}/rc))")));
        assert!(!c.contains("; exit"));
        // Bounded: 2 s in 50 ms steps, then the process is killed and the step fails.
        assert!(c.contains("[ $i -lt 40 ]"));
        assert!(c.contains(&format!("kill $(cat {DIR}/pid)")));
    }
}
