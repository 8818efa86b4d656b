//! Doorbells that reach the host as eventfd writes: an ivshmem doorbell from a QEMU guest
//! (the device server) or a KVM ioeventfd on BAR0 (hcabench's VMM). Both hosts run the
//! same pump: one thread per HCA that waits on every doorbell class's eventfd and turns each
//! wake-up into one [`Hca::doorbell`] call.

use std::io;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::Hca;

/// The epoll token of the stop eventfd (doorbell classes are 0..n).
const STOP: u64 = u64::MAX;

/// A running doorbell thread; dropping it stops the thread and waits for it.
pub struct DoorbellPump {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl DoorbellPump {
    /// Starts `<name>-doorbell`, which rings doorbell class `c` of `hca` whenever `fds[c]`
    /// is written. The eventfds must be non-blocking.
    pub fn start(name: &str, hca: Hca, fds: Vec<EventFd>) -> io::Result<DoorbellPump> {
        let epoll = Epoll::new()?;
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let watch = |fd: i32, token: u64| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        for (class, fd) in fds.iter().enumerate() {
            watch(fd.as_raw_fd(), class as u64)?;
        }
        watch(stop.as_raw_fd(), STOP)?;
        let thread = std::thread::Builder::new()
            .name(format!("{name}-doorbell"))
            .spawn(move || pump(&epoll, &hca, &fds))?;
        Ok(DoorbellPump {
            stop,
            thread: Some(thread),
        })
    }
}

fn pump(epoll: &Epoll, hca: &Hca, fds: &[EventFd]) {
    let mut events = vec![EpollEvent::default(); fds.len() + 1];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("doorbell epoll failed, doorbells stop: {e}");
                return;
            }
        };
        for ev in events.iter().take(n) {
            if ev.data() == STOP {
                return;
            }
            let class = ev.data() as usize;
            // Coalesced writes read as one count: the model rescans its queues anyway.
            if fds.get(class).is_some_and(|fd| fd.read().is_ok()) {
                hca.doorbell(class as u32);
            }
        }
    }
}

impl Drop for DoorbellPump {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    #[test]
    fn test_each_eventfd_write_rings_its_class_until_the_pump_stops() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let hca = Hca::new(
            mem,
            crate::DeviceMemory::new().unwrap(),
            Arc::new(crate::NoInterrupts),
            1,
        );
        let fds: Vec<EventFd> = (0..4)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let writers: Vec<EventFd> = fds.iter().map(|f| f.try_clone().unwrap()).collect();
        let pump = DoorbellPump::start("t", hca.clone(), fds).unwrap();
        let rung = |want: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while hca.stats().doorbells < want {
                assert!(
                    Instant::now() < deadline,
                    "{} of {want} doorbells",
                    hca.stats().doorbells
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        writers[3].write(1).unwrap();
        rung(1);
        writers[0].write(1).unwrap();
        rung(2);
        drop(pump);
        writers[1].write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(hca.stats().doorbells, 2, "a stopped pump rings nothing");
    }
}
