//! A command channel into a guest booted with `hcabench.cmd=agent`, over its serial console
//! socket. The guest's init runs a non-interactive shell on the console with echo off; each
//! command is followed by a marker line carrying its exit status, so output and status come
//! back without guessing where one command ends.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::console_protocol;

/// One guest's shell.
pub struct Agent {
    pub name: String,
    stream: UnixStream,
    pending: Vec<u8>,
    seq: u64,
}

impl Agent {
    /// Connects to the console socket (QEMU creates it at start-up) and checks the shell
    /// answers. Call after the guest printed [`console_protocol::AGENT`].
    pub fn connect(name: &str, socket: &Path, timeout: Duration) -> Result<Agent, String> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("{name}: console {}: {e}", socket.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| format!("{name}: {e}"))?;
        let mut a = Agent {
            name: name.to_string(),
            stream,
            pending: Vec::new(),
            seq: 0,
        };
        // The shell may not read the console yet: ask until it answers.
        loop {
            match a.status("true", Duration::from_secs(2)) {
                Ok(_) => return Ok(a),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// Runs `cmd` in the guest's shell; its output (stdout and stderr) if it exits 0.
    pub fn run(&mut self, cmd: &str, timeout: Duration) -> Result<String, String> {
        match self.status(cmd, timeout)? {
            (0, out) => Ok(out),
            (rc, out) => Err(format!(
                "{}: `{cmd}` failed (exit {rc}): {}",
                self.name,
                out.trim()
            )),
        }
    }

    /// Runs `cmd`; its exit status and output, whatever the status.
    pub fn status(&mut self, cmd: &str, timeout: Duration) -> Result<(i32, String), String> {
        self.seq += 1;
        let marker = format!("{} {} ", console_protocol::RC, self.seq);
        // The command on its own line (it may end in `&`), then the marker. Its stdin is
        // /dev/null: the shell's stdin is the console, and the next commands must stay there.
        // The blank lines after it push the command through the guest's 16550 receive FIFO:
        // bytes below its trigger level wait for a timeout interrupt that QEMU's TCG
        // guests do not always get, so a short command would sit there until the next.
        let line = format!(
            "{{ {cmd}\n}} < /dev/null 2>&1\necho \"{marker}$?\"\n{}",
            "\n".repeat(16)
        );
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| format!("{}: console write: {e}", self.name))?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(done) = self.take_until(&marker) {
                return Ok(done);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: `{cmd}` gave no answer within {timeout:?}; output so far:\n{}",
                    self.name,
                    String::from_utf8_lossy(&self.pending)
                ));
            }
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(format!("{}: console closed (guest gone?)", self.name)),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(format!("{}: console read: {e}", self.name)),
            }
        }
    }

    /// If the marker line arrived: removes everything up to it and returns (status, output).
    fn take_until(&mut self, marker: &str) -> Option<(i32, String)> {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        let at = text.find(marker)?;
        let end = at + text[at..].find('\n')?;
        let rc = text[at + marker.len()..end].trim().parse().unwrap_or(-1);
        let out = text[..at].replace('\r', "");
        self.pending = text.as_bytes()[end + 1..].to_vec();
        Some((rc, out))
    }
}
