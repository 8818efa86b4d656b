//! Gives the heap memory the device models freed back to the operating system.
//!
//! glibc keeps what is freed in its arenas: it returns the top of the main heap past a
//! threshold, but not free memory below a live allocation, nor most of another thread's
//! arena (each node's thread allocates in one of its own). After a hostile guest let go
//! of what it made its device hold, the server's RSS stayed near its peak (issue 49: 1.4
//! GiB after the attack, with the models' own heap back near where it started). A thread
//! looks once a second and, when the allocator holds more than [`TRIM_SLACK`] free, calls
//! `malloc_trim`, which returns every arena's free pages.
//!
//! Trimming returns only whole free pages. A block of 128 KiB or more (the room of a QP's
//! long window of WRs in flight, a long message's records) that glibc carves out of a heap
//! leaves, once freed, pages that the small blocks allocated after it pin; and glibc's
//! threshold for mapping such blocks on their own rises (up to 32 MiB) each time one is
//! freed. So the server fixes the threshold ([`tune`]): every block of
//! [`MMAP_THRESHOLD`] or more is mapped on its own and unmapped when freed, at once. (In
//! `hca-model/tests/memory.rs` a guest filling and flushing a 4096-WR window on each of
//! 256 QPs left 30 MiB resident that trimming did not return with glibc's default, and
//! none with this.)

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Free heap memory the allocator may keep before it is asked to give it back.
pub const TRIM_SLACK: usize = 16 << 20;

/// How often the thread looks.
const PERIOD: Duration = Duration::from_secs(1);

/// Blocks of this size or more are mapped on their own, and unmapped when freed (see
/// [`tune`]): glibc's initial threshold, fixed.
pub const MMAP_THRESHOLD: usize = 128 << 10;

/// Fixes the allocator's threshold for mapping a block on its own at [`MMAP_THRESHOLD`]
/// (glibc's otherwise rises as big blocks are freed, and then carves them out of heaps
/// that trimming cannot shrink past what was allocated after them); whether it could.
pub fn tune() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt takes two integers and changes only the allocator's parameters.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

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
        if !tune() {
            log::debug!("the allocator's mmap threshold is its own");
        }
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
    use hca_model::sync::Unpoisoned;
    use std::sync::Mutex;

    /// One test at a time: each reads the process's RSS.
    static SERIAL: Mutex<()> = Mutex::new(());

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
        let _one = SERIAL.lock_unpoisoned();
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

    #[test]
    fn test_big_blocks_freed_go_back_to_the_system_at_once_when_tuned() {
        let _one = SERIAL.lock_unpoisoned();
        assert!(tune());
        // A big block freed first: glibc's own threshold would rise past the size of
        // those below, which it would then carve out of the heap.
        drop(std::hint::black_box(vec![1u8; 8 << 20]));
        let before = rss();
        // 48 blocks of 1 MiB, each followed by a small block that stays (a QP's state,
        // made while another's window was long).
        let mut big = Vec::new();
        let mut pins = Vec::new();
        for i in 0..48u8 {
            big.push(vec![i | 1; 1 << 20]);
            pins.push(Box::new([i; 64]));
        }
        let peak = rss();
        assert!(peak >= before + (40 << 20), "RSS {before} then {peak}");
        drop(big);
        // No trim: unmapped as they were freed.
        let after = rss();
        assert!(
            after + (40 << 20) <= peak,
            "RSS {peak} at the peak, {after} after"
        );
        assert!(pins.iter().enumerate().all(|(i, p)| p[0] == i as u8));
    }
}
