//! The other hosts of a cluster that spans hosts, started and stopped from this one over
//! ssh (`hcabench up --host a --start-others`, `hcabench down --others`): each `[[host]]`
//! with an `ssh` destination runs `hcabench up --config FILE --host NAME` (or `hcabench
//! down`) there, the cluster file at the same path, while this host boots its own nodes.
//! Their output comes back line by line, each line marked with its host.
//!
//! The command that reaches a host is `$HCABENCH_SSH DEST COMMAND` (default: ssh with
//! `BatchMode`, `ConnectTimeout=10` and `ServerAlive*` options, so that a host that wants a
//! password, does not answer or goes silent fails within a minute rather than waiting for
//! what never comes; split on white space, so no quoted words); COMMAND runs `$HCABENCH_REMOTE` there (default: `hcabench`, as
//! the PATH of ssh's shell finds it).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use hcabench::config::HostConfig;

/// The command `DEST COMMAND` is appended to.
const DEFAULT_SSH: &str =
    "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15 -o ServerAliveCountMax=3";

/// Why another host could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "--start-others starts the other hosts over ssh, and {0} has no `ssh` destination \
         in the cluster file (e.g. ssh = \"user@machine\" in its [[host]] table); start it \
         there with `hcabench up --config FILE --host NAME`"
    )]
    NoSsh(String),
    #[error("cannot run `{command}` for host {host}: {source}")]
    Spawn {
        host: String,
        command: String,
        source: std::io::Error,
    },
    #[error(
        "host {host} did not start (`{command}` exited with {status}); its last words:\n{tail}"
    )]
    Failed {
        host: String,
        command: String,
        status: std::process::ExitStatus,
        tail: String,
    },
}

/// A command started on another host, its output being relayed.
pub struct Remote {
    host: String,
    command: String,
    child: Child,
    relays: Vec<JoinHandle<Vec<String>>>,
}

/// `s` quoted for a POSIX shell (the remote side runs the command through one).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The hosts other than `here`, each with its ssh destination.
pub fn others<'a>(
    hosts: &'a [HostConfig],
    here: &str,
) -> Result<Vec<(&'a HostConfig, &'a str)>, LaunchError> {
    (hosts.iter())
        .filter(|h| h.name != here)
        .map(|h| match &h.ssh {
            Some(dest) => Ok((h, dest.as_str())),
            None => Err(LaunchError::NoSsh(h.name.clone())),
        })
        .collect()
}

/// Runs `hcabench ARGS` on host `host` at `dest`, relaying its output as it comes.
pub fn start(host: &str, dest: &str, args: &[&str]) -> Result<Remote, LaunchError> {
    let ssh = std::env::var("HCABENCH_SSH").unwrap_or_else(|_| DEFAULT_SSH.to_string());
    let mut words = ssh.split_whitespace();
    let program = words.next().unwrap_or("ssh");
    let bin = std::env::var("HCABENCH_REMOTE").unwrap_or_else(|_| "hcabench".to_string());
    let remote: Vec<String> = std::iter::once(quote(&bin))
        .chain(args.iter().map(|a| quote(a)))
        .collect();
    let remote = remote.join(" ");
    let command = format!("{ssh} {dest} {remote}");
    let spawn_error = |source| LaunchError::Spawn {
        host: host.to_string(),
        command: command.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(words)
        .arg(dest)
        .arg(&remote)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let mut relays = Vec::new();
    let out: Option<Box<dyn std::io::Read + Send>> = match child.stdout.take() {
        Some(o) => Some(Box::new(o)),
        None => None,
    };
    let err: Option<Box<dyn std::io::Read + Send>> = match child.stderr.take() {
        Some(e) => Some(Box::new(e)),
        None => None,
    };
    for stream in [out, err].into_iter().flatten() {
        let host = host.to_string();
        relays.push(std::thread::spawn(move || {
            // Every line is shown as it comes (read to the end whatever it holds, so that
            // the far side never blocks on a full pipe); the last few are kept for an error.
            let mut tail = Vec::new();
            let mut r = BufReader::new(stream);
            let mut buf = Vec::new();
            while matches!(r.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
                let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                buf.clear();
                let _ = writeln!(std::io::stdout(), "  [host {host}] {line}");
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
            tail
        }));
    }
    Ok(Remote {
        host: host.to_string(),
        command,
        child,
        relays,
    })
}

impl Remote {
    /// The host it runs on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Waits for the command to end: an error with its last lines if it failed.
    pub fn wait(mut self) -> Result<(), LaunchError> {
        let status = self.child.wait().map_err(|source| LaunchError::Spawn {
            host: self.host.clone(),
            command: self.command.clone(),
            source,
        })?;
        let mut tail = Vec::new();
        for r in self.relays {
            tail.extend(r.join().unwrap_or_default());
        }
        if status.success() {
            return Ok(());
        }
        Err(LaunchError::Failed {
            host: self.host,
            command: self.command,
            status,
            tail: tail.join("\n"),
        })
    }
}

/// `hcabench up --config CONFIG --host NAME OPTIONS` on every other host, started at
/// once (OPTIONS: this host's `up` options that are the whole cluster's).
pub fn start_others(
    hosts: &[HostConfig],
    here: &str,
    config: &Path,
    options: &[String],
) -> Result<Vec<Remote>, LaunchError> {
    let config = config.to_string_lossy();
    let mut started = Vec::new();
    for (h, dest) in others(hosts, here)? {
        println!("host {}: starting it over ssh ({dest})", h.name);
        let mut args = vec!["up", "--config", &config, "--host", &h.name];
        args.extend(options.iter().map(String::as_str));
        match start(&h.name, dest, &args) {
            Ok(r) => started.push(r),
            Err(e) => {
                // Those already on their way finish (their hosts then stay up), reported.
                for r in started {
                    let _ = r.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, ssh: Option<&str>) -> HostConfig {
        HostConfig {
            name: name.into(),
            address: "10.0.0.1:7700".parse().unwrap(),
            nodes: 1,
            ssh: ssh.map(str::to_string),
        }
    }

    #[test]
    fn test_every_other_host_needs_an_ssh_destination_and_its_words_are_quoted() {
        let hosts = [host("a", None), host("b", Some("me@b")), host("c", None)];
        let e = others(&hosts, "a").unwrap_err().to_string();
        assert!(e.contains("c has no `ssh` destination"), "{e}");
        let ok = others(&hosts[..2], "a").unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!((ok[0].0.name.as_str(), ok[0].1), ("b", "me@b"));
        assert_eq!(quote("/a b/it's.toml"), r"'/a b/it'\''s.toml'");
    }
}
