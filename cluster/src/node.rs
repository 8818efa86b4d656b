//! What the launcher needs of one booted guest, whatever hosts it: a QEMU process
//! ([`crate::qemu::QemuNode`]) or a VM in hcabench's own VMM ([`crate::kvm::KvmNode`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hca_model::Hca;

use crate::console_protocol::INIT;
use crate::hotplug::HotplugError;

/// A booted guest: node `k` (from 0) of a cluster is named `node{k+1}` and has LID `k + 1`.
pub trait Node: Send {
    fn name(&self) -> &str;
    /// The serial console so far.
    fn console(&self) -> String;
    /// The console's complete lines so far.
    fn console_lines(&self) -> Vec<String> {
        complete_lines(&self.console())
    }
    /// Waits for a console line starting with `prefix`; returns it and when it came (time
    /// since the guest started). Fails on timeout or if the guest stops first.
    fn wait_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(String, Duration), WaitError>;
    /// The guest's own host process, where it has one (QEMU's).
    fn pid(&self) -> Option<u32>;
    /// Why the guest stopped on its own (its host process exited, a vCPU failed), or None
    /// while it runs.
    fn stopped(&mut self) -> Option<String>;
    fn is_running(&mut self) -> bool {
        self.stopped().is_none()
    }
    /// Stops the guest at once (as a crash would); its HCA leaves the fabric.
    fn kill(&mut self);
    /// The guest's HCA where the guest's host holds it and it is on the fabric (None: the
    /// device server holds it, or the guest stopped).
    fn hca(&self) -> Option<Hca> {
        None
    }
    /// PCI hot-unplug of the guest's HCA ([`crate::hotplug`]): returns once the guest's
    /// kernel released it and its port left the fabric.
    fn unplug_hca(&mut self) -> Result<(), HotplugError> {
        Err(HotplugError::Unsupported {
            node: self.name().to_string(),
        })
    }
    /// PCI hot-plug of a new HCA into the slot `unplug_hca` emptied.
    fn replug_hca(&mut self) -> Result<(), HotplugError> {
        Err(HotplugError::Unsupported {
            node: self.name().to_string(),
        })
    }
    /// Boots the stopped guest again from power-on, with a fresh HCA on its port, for a
    /// guest whose kernel crashed on its way up ([`crash_before_init`]); returns where the
    /// old console log is kept (its name, then `.crash{attempt}`). None where the backend
    /// cannot (the guest stays stopped).
    fn boot_again(&mut self, _attempt: u32) -> std::io::Result<Option<PathBuf>> {
        Ok(None)
    }
}

/// Console lines that mean the guest's kernel crashed.
const CRASH_MARKERS: [&str; 5] = [
    "Kernel panic",
    "Oops:",
    "BUG: ",
    "general protection fault",
    "invalid opcode",
];

/// The first crash line on `console` when the guest's kernel crashed before its init printed
/// [`INIT`], its first line from user space. Nothing of hcabench's runs in the guest by then
/// (the HCA's driver is a module init loads), so such a crash is the kernel's own or the
/// emulator's: Debian 6.12 under TCG now and then takes an `int3` Oops while patching its
/// text at boot. None when init had started, or no crash shows.
pub fn crash_before_init(console: &str) -> Option<String> {
    let lines = complete_lines(console);
    if lines.iter().any(|l| l.contains(INIT)) {
        return None;
    }
    lines
        .into_iter()
        .find(|l| CRASH_MARKERS.iter().any(|m| l.contains(m)))
}

/// Why an awaited console line never came; the console so far goes with it.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The guest stopped first (`why`: its host's words).
    #[error("{node}: {host} stopped before `{prefix}`: {why}; console:\n{console}")]
    Stopped {
        node: String,
        host: String,
        prefix: String,
        why: String,
        console: String,
    },
    #[error(
        "{node}: no `{prefix}` on the console within {timeout:?} ({host}); console so \
         far:\n{console}"
    )]
    TimedOut {
        node: String,
        host: String,
        prefix: String,
        timeout: Duration,
        console: String,
    },
}

/// The newline-terminated lines of `text`, without their line ends.
pub fn complete_lines(text: &str) -> Vec<String> {
    let done = text.rfind('\n').map_or("", |end| &text[..end]);
    done.lines().map(|l| l.trim_end().to_string()).collect()
}

/// The last 40 lines of a console log (for error reports).
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Polls `console` until a complete line starts with `prefix` (the line), `stopped` says
/// why the guest stopped, or `timeout` passes; `who` and `host` name the guest in errors.
pub fn wait_for_line(
    who: &str,
    host: &str,
    prefix: &str,
    timeout: Duration,
    console: &dyn Fn() -> String,
    stopped: &mut dyn FnMut() -> Option<String>,
) -> Result<String, WaitError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = complete_lines(&console())
            .into_iter()
            .find(|l| l.starts_with(prefix))
        {
            return Ok(l);
        }
        if let Some(why) = stopped() {
            return Err(WaitError::Stopped {
                node: who.to_string(),
                host: host.to_string(),
                prefix: prefix.to_string(),
                why,
                console: console(),
            });
        }
        if Instant::now() > deadline {
            return Err(WaitError::TimedOut {
                node: who.to_string(),
                host: host.to_string(),
                prefix: prefix.to_string(),
                timeout,
                console: console(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_line_still_being_written_is_not_a_line_yet() {
        assert_eq!(
            complete_lines("a\nHCABENCH-PROBE HCA found lid=1 por"),
            vec!["a"]
        );
        assert_eq!(complete_lines("a\r\nb\n"), vec!["a", "b"]);
        assert!(complete_lines("no newline").is_empty());
    }

    #[test]
    fn test_a_kernel_crash_counts_only_before_init() {
        let oops = "[    0.000000] Linux version 6.12.48\n\
                    [    0.912000] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
                    [    0.913000] RIP: 0010:sched_clock_cpu+0x9/0x1c0\n\
                    [    0.920000] Kernel panic - not syncing: Fatal exception\n";
        assert_eq!(
            crash_before_init(oops).as_deref(),
            Some("[    0.912000] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI")
        );
        // Once init ran, a crash may be hcabench's (its driver), so it is not boot luck.
        let later = format!("HCABENCH-INIT node=node1 kernel=6.12 uptime=1.2\n{oops}");
        assert_eq!(crash_before_init(&later), None);
        assert_eq!(crash_before_init("[    0.1] booting\n"), None);
    }

    #[test]
    fn test_waiting_for_a_line_ends_when_the_guest_stops() {
        let console = || "booting\n".to_string();
        let e = wait_for_line(
            "node1",
            "QEMU",
            "READY",
            Duration::from_secs(60),
            &console,
            &mut || Some("exit 1".into()),
        )
        .unwrap_err();
        assert!(
            matches!(&e, WaitError::Stopped { why, .. } if why == "exit 1"),
            "{e}"
        );
        assert!(
            e.to_string().contains("stopped before `READY`: exit 1"),
            "{e}"
        );
        let l = wait_for_line(
            "node1",
            "QEMU",
            "boot",
            Duration::ZERO,
            &console,
            &mut || None,
        );
        assert_eq!(l.unwrap(), "booting");
    }
}
