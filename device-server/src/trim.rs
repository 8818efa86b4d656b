//! Gives the heap memory the device models freed back to the operating system.
//!
//! glibc keeps what is freed in its arenas: it returns the top of the main heap past a
//! threshold, but not free memory below a live allocation, nor most of another thread's
//! arena (each node's thread allocates in one of its own). After a hostile guest let go
//! of what it made its device hold, the server's RSS stayed near its peak (issue 49: 1.4
//! GiB after the attack, with the models' own heap back near where it started). A thread
//! looks once a second and, when the allocator holds more than [`TRIM_SLACK`] free, calls
//! `malloc_trim`, which returns every arena's free pages.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Free heap memory the allocator may keep before it is asked to give it back.
pub const TRIM_SLACK: usize = 16 << 20;

/// How often the thread looks.
const PERIOD: Duration = Duration::from_secs(1);

/// Bytes the allocator holds free, in all its arenas (0 where that is not known).
pub fn free_heap() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no argument and only reads the allocator's state.
        let info = unsafe { libc::mallinfo2() };
        info.fordblks
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// Gives free heap memory back to the operating system if there is more than
/// [`TRIM_SLACK`] of it; whether it tried.
pub fn trim_if_slack() -> bool {
    if free_heap() <= TRIM_SLACK {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a byte count (the slack to keep at the heap's top)
        // and only changes the allocator's own state.
        unsafe { libc::malloc_trim(0) };
    }
    true
}

/// The thread that trims; stopped and joined when dropped.
pub(crate) struct Trimmer {
    /// Dropping it stops the thread (its receiver sees the channel close).
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Trimmer {
    pub(crate) fn start() -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("heap-trim".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(PERIOD) {
                    if trim_if_slack() {
                        log::debug!("gave free heap memory back to the system");
                    }
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn rss() -> usize {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        s.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<usize>()
            .unwrap()
            * 4096
    }

    #[test]
    fn test_freed_small_allocations_go_back_to_the_system_when_trimmed() {
        // 64 MiB in 300-byte pieces (as WRs in flight hold it), one in 128 of them kept
        // (as a QP made meanwhile is): the heap's top cannot simply shrink past them.
        let mut pieces: Vec<Box<[u8; 300]>> =
            (0..(64 << 20) / 300).map(|_| Box::new([1; 300])).collect();
        let peak = rss();
        let mut i = 0;
        pieces.retain(|_| {
            i += 1;
            i % 128 == 0
        });
        let pin = pieces;
        let free = free_heap();
        assert!(free > TRIM_SLACK, "{free} bytes free");
        assert!(trim_if_slack());
        let after = rss();
        assert!(
            after + (48 << 20) < peak,
            "RSS {peak} before, {after} after"
        );
        assert!(pin.iter().all(|p| p[0] == 1));
    }
}
