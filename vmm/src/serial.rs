//! The 16550 serial port's host side: the log file, an in-memory copy of the first output
//! (for tests and early-boot checks), and an attachable console: a unix socket whose one
//! client at a time sees the output and types into the port's receive FIFO.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// Output kept in memory beyond this goes only to the log and the client.
const CAPTURE_LIMIT: usize = 1 << 20;

/// The serial port's interrupt line: an irqfd on its IOAPIC pin.
pub struct IrqLine(pub EventFd);

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub type SerialPort = Serial<IrqLine, NoEvents, ConsoleOut>;

/// Where the guest's serial output goes.
pub struct ConsoleOut {
    log: Option<File>,
    captured: Arc<Mutex<Vec<u8>>>,
    client: Arc<Mutex<Option<UnixStream>>>,
}

impl ConsoleOut {
    pub fn new(log: Option<&Path>) -> Result<ConsoleOut, String> {
        let log = match log {
            Some(p) => Some(File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
            None => None,
        };
        Ok(ConsoleOut {
            log,
            captured: Arc::new(Mutex::new(Vec::new())),
            client: Arc::new(Mutex::new(None)),
        })
    }

    pub fn attached(&self) -> bool {
        crate::lock(&self.client).is_some()
    }

    /// The first [`CAPTURE_LIMIT`] bytes of output, shared.
    pub fn captured(&self) -> Arc<Mutex<Vec<u8>>> {
        self.captured.clone()
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = &mut self.log {
            f.write_all(b)?;
        }
        let mut c = crate::lock(&self.captured);
        let room = CAPTURE_LIMIT.saturating_sub(c.len());
        c.extend(b.iter().take(room));
        drop(c);
        let mut client = crate::lock(&self.client);
        if let Some(s) = client.as_mut() {
            // A client that went away, or blocks a write for longer than its 200 ms write
            // timeout, is dropped: the guest's vCPU never waits on it for longer.
            if s.write_all(b).is_err() {
                *client = None;
            }
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serves the console socket at `path` until `stop`: one client at a time (the next waits
/// until it leaves); what the client sends goes into the receive FIFO, paced to the FIFO's
/// room so nothing typed is lost.
pub fn serve(
    path: &Path,
    port: Arc<Mutex<SerialPort>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, String> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let client = crate::lock(&port).writer().client.clone();
    std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => attach(s, &port, &client, &stop),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        log::warn!("console socket: {e}");
                        std::thread::sleep(Duration::from_millis(50))
                    }
                }
            }
        })
        .map_err(|e| format!("console thread: {e}"))
}

fn attach(
    s: UnixStream,
    port: &Mutex<SerialPort>,
    client: &Mutex<Option<UnixStream>>,
    stop: &AtomicBool,
) {
    let (Ok(mut input), Ok(())) = (
        s.try_clone(),
        s.set_read_timeout(Some(Duration::from_millis(50))),
    ) else {
        return;
    };
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    *crate::lock(client) = Some(s);
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::SeqCst) {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        let mut sent = 0;
        while sent < n && !stop.load(Ordering::SeqCst) {
            // An error is a full FIFO: the guest has not read yet.
            let rest = buf.get(sent..n).unwrap_or_default();
            if let Ok(k) = crate::lock(port).enqueue_raw_bytes(rest) {
                sent += k;
            }
            if sent < n {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    *crate::lock(client) = None;
}
