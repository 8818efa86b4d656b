//! One KVM virtual machine with an HCA: assembly (RAM, irqchip, PCI bus, serial, the HCA's
//! BARs, doorbell ioeventfds, MSI-X irqfds) and the vCPU threads with their exit handling.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hca_model::abi::{BAR0_DOORBELL, BAR2_SIZE, DOORBELL_PEER_SHIFT, NUM_VECTORS};
use hca_model::DeviceMemory;
use hca_model::Fabric;
use hca_model::Hca;
use kvm_ioctls::{IoEventAddress, Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use super::boot;
use super::hca_pci::{HcaPci, Msix, BAR1_SIZE};
use super::pci::PciBus;

pub const COM1: u16 = 0x3f8;
/// A byte written here ends the run with that exit code (the test guest's verdict).
pub const EXIT_PORT: u16 = 0x501;
const SERIAL_GSI: u32 = 4;
const BAR2_SLOT: u32 = 1;
/// The doorbell peer id this machine's guests must use (one HCA per machine).
const DOORBELL_PEER: u32 = 0;

pub struct MachineConfig {
    pub name: String,
    pub ram_bytes: usize,
    /// The serial console's log file (None: kept in memory only).
    pub serial_log: Option<PathBuf>,
}

/// The serial port's output: the log file and an in-memory copy.
struct Console {
    log: Option<File>,
    text: Arc<Mutex<Vec<u8>>>,
}

impl Write for Console {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = &mut self.log {
            f.write_all(b)?;
        }
        self.text.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The serial port's interrupt line: an irqfd on the IOAPIC pin.
struct IrqLine(EventFd);

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// What the vCPU threads share.
struct Devices {
    serial: Mutex<Serial<IrqLine, NoEvents, Console>>,
    bus: Mutex<PciBus>,
    hca_pci: Arc<Mutex<HcaPci>>,
    msix: Arc<Msix>,
    hca: Hca,
    exit_code: Mutex<Option<u8>>,
    stop: AtomicBool,
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The byte the guest wrote to [`EXIT_PORT`]; None: it ran out of time.
    pub exit_code: Option<u8>,
    pub serial: String,
    pub elapsed: Duration,
}

pub struct Machine {
    pub name: String,
    /// The VM (its device threads hold it too); its slots map `mem` and BAR2.
    _vm: Arc<VmFd>,
    mem: GuestMemoryMmap,
    vcpus: Vec<VcpuFd>,
    devices: Arc<Devices>,
    console: Arc<Mutex<Vec<u8>>>,
    doorbell_stop: Arc<EventFd>,
    doorbell_thread: Option<JoinHandle<()>>,
}

/// Registers (or with `remove`, unregisters) the doorbell ioeventfds at a BAR0 base.
fn doorbell_ioevents(vm: &VmFd, fds: &[EventFd], bar0: u64, remove: bool) -> Result<(), String> {
    let addr = IoEventAddress::Mmio(bar0 + u64::from(BAR0_DOORBELL));
    for (class, fd) in fds.iter().enumerate() {
        let value = DOORBELL_PEER << DOORBELL_PEER_SHIFT | class as u32;
        let r = if remove {
            vm.unregister_ioevent(fd, &addr, value)
        } else {
            vm.register_ioevent(fd, &addr, value)
        };
        r.map_err(|e| format!("doorbell ioeventfd (class {class}): {e}"))?;
    }
    Ok(())
}

/// The doorbell thread: each ioeventfd that fires is one doorbell class for the model.
fn doorbell_loop(hca: Hca, fds: Arc<Vec<EventFd>>, stop: Arc<EventFd>) {
    let epoll = Epoll::new().expect("epoll");
    for (i, fd) in fds.iter().enumerate() {
        let _ = epoll.ctl(
            ControlOperation::Add,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            EpollEvent::new(EventSet::IN, i as u64),
        );
    }
    let _ = epoll.ctl(
        ControlOperation::Add,
        std::os::fd::AsRawFd::as_raw_fd(&*stop),
        EpollEvent::new(EventSet::IN, u64::MAX),
    );
    let mut events = vec![EpollEvent::default(); fds.len() + 1];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        for ev in &events[..n] {
            if ev.data() == u64::MAX {
                return;
            }
            let class = ev.data() as usize;
            if fds[class].read().is_ok() {
                hca.doorbell(class as u32);
            }
        }
    }
}

extern "C" fn kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

impl Machine {
    /// A VM with `cfg.ram_bytes` of RAM, one vCPU and an HCA attached to `fabric`.
    pub fn new(kvm: &Kvm, cfg: MachineConfig, fabric: &Fabric) -> Result<Machine, String> {
        let vm = Arc::new(kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?);
        vm.set_tss_address(0xfffb_d000)
            .map_err(|e| format!("KVM_SET_TSS_ADDR: {e}"))?;
        vm.create_irq_chip()
            .map_err(|e| format!("KVM_CREATE_IRQCHIP: {e}"))?;
        let mem = boot::guest_ram(cfg.ram_bytes)?;
        boot::map_ram(&vm, &mem)?;

        let bar2 = DeviceMemory::new().map_err(|e| format!("BAR2: {e}"))?;
        let msix = Msix::new(vm.clone())?;
        let hca = Hca::new(mem.clone(), bar2, msix.clone(), node_guid(&cfg.name));
        hca.set_doorbell_peer(DOORBELL_PEER);
        hca.attach(fabric);

        let fds: Arc<Vec<EventFd>> = Arc::new(
            (0..NUM_VECTORS)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}")))
                .collect::<Result<_, _>>()?,
        );
        // The Hca (which the Machine holds) keeps BAR2's mapping alive.
        let bar2_host = hca.bar2().region().as_ptr() as u64;
        let on_move = {
            let (vm, fds) = (vm.clone(), fds.clone());
            Box::new(move |bar: usize, old: u64, new: u64| {
                let r = match bar {
                    0 => doorbell_ioevents(&vm, &fds, old, true)
                        .and_then(|_| doorbell_ioevents(&vm, &fds, new, false)),
                    // SAFETY: BAR2's mapping lives in the Machine, which outlives the VM fd's use.
                    2 => unsafe {
                        boot::map_slot(&vm, BAR2_SLOT, old, 0, bar2_host).and_then(|_| {
                            boot::map_slot(&vm, BAR2_SLOT, new, u64::from(BAR2_SIZE), bar2_host)
                        })
                    },
                    _ => Ok(()),
                };
                if let Err(e) = r {
                    log::error!("moving BAR{bar} to {new:#x}: {e}");
                }
            })
        };
        let hca_pci = Arc::new(Mutex::new(HcaPci::new(msix.clone(), on_move)));
        let bars = hca_pci.lock().unwrap().mapped_bars();
        doorbell_ioevents(&vm, &fds, bars[0], false)?;
        // SAFETY: as above.
        unsafe { boot::map_slot(&vm, BAR2_SLOT, bars[2], u64::from(BAR2_SIZE), bar2_host)? };
        let mut bus = PciBus::new();
        bus.add(hca_pci.clone());

        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
        vm.register_irqfd(&serial_irq, SERIAL_GSI)
            .map_err(|e| format!("serial irqfd: {e}"))?;
        let console = Arc::new(Mutex::new(Vec::new()));
        let log = match &cfg.serial_log {
            Some(p) => Some(File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
            None => None,
        };
        let serial = Serial::new(
            IrqLine(serial_irq),
            Console {
                log,
                text: console.clone(),
            },
        );

        let vcpu = vm
            .create_vcpu(0)
            .map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| format!("KVM_GET_SUPPORTED_CPUID: {e}"))?;
        vcpu.set_cpuid2(&cpuid)
            .map_err(|e| format!("KVM_SET_CPUID2: {e}"))?;

        let doorbell_stop =
            Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"))?);
        let doorbell_thread = {
            let (hca, fds, stop) = (hca.clone(), fds.clone(), doorbell_stop.clone());
            std::thread::Builder::new()
                .name(format!("{}-doorbell", cfg.name))
                .spawn(move || doorbell_loop(hca, fds, stop))
                .map_err(|e| format!("doorbell thread: {e}"))?
        };
        Ok(Machine {
            name: cfg.name,
            devices: Arc::new(Devices {
                serial: Mutex::new(serial),
                bus: Mutex::new(bus),
                hca_pci,
                msix,
                hca,
                exit_code: Mutex::new(None),
                stop: AtomicBool::new(false),
            }),
            _vm: vm,
            mem,
            vcpus: vec![vcpu],
            console,
            doorbell_stop,
            doorbell_thread: Some(doorbell_thread),
        })
    }

    pub fn hca(&self) -> &Hca {
        &self.devices.hca
    }

    /// The guest's RAM (a cheap handle onto the same mapping).
    pub fn memory(&self) -> GuestMemoryMmap {
        self.mem.clone()
    }

    /// Loads a flat binary at `addr` and enters it in 64-bit mode (the bare-metal test
    /// guest's start state).
    pub fn load_flat(&self, blob: &[u8], addr: u64, stack: u64) -> Result<(), String> {
        self.mem
            .write_slice(blob, GuestAddress(addr))
            .map_err(|e| format!("loading {} bytes at {addr:#x}: {e}", blob.len()))?;
        boot::enter_long_mode(&self.mem, &self.vcpus[0], addr, stack)
    }

    /// Runs the vCPUs (a thread each) until the guest writes [`EXIT_PORT`], a vCPU fails,
    /// or `timeout` passes.
    pub fn run(&mut self, timeout: Duration) -> Result<Outcome, String> {
        register_signal_handler(SIGRTMIN(), kick).map_err(|e| format!("signal: {e}"))?;
        let started = Instant::now();
        let mut threads = Vec::new();
        for (i, vcpu) in std::mem::take(&mut self.vcpus).into_iter().enumerate() {
            let d = self.devices.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{}-vcpu{i}", self.name))
                    .spawn(move || vcpu_loop(vcpu, &d))
                    .map_err(|e| format!("vcpu thread: {e}"))?,
            );
        }
        while threads.iter().any(|t| !t.is_finished()) && started.elapsed() < timeout {
            if self.devices.exit_code.lock().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.devices.stop.store(true, Ordering::SeqCst);
        let mut err = None;
        for t in threads {
            // Kick a vCPU out of KVM_RUN until it sees `stop`.
            while !t.is_finished() {
                use std::os::unix::thread::JoinHandleExt;
                // SAFETY: the thread is alive (not finished, not joined) and our
                // handler for the signal does nothing.
                unsafe { libc::pthread_kill(t.as_pthread_t(), SIGRTMIN()) };
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Ok(Err(e)) = t.join() {
                err = Some(e);
            }
        }
        let exit_code = *self.devices.exit_code.lock().unwrap();
        let serial = String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned();
        if let (None, Some(e)) = (exit_code, err) {
            return Err(format!("{}: {e}\nserial console:\n{serial}", self.name));
        }
        Ok(Outcome {
            exit_code,
            serial,
            elapsed: started.elapsed(),
        })
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = self.doorbell_stop.write(1);
        if let Some(t) = self.doorbell_thread.take() {
            let _ = t.join();
        }
        self.devices.hca.detach();
    }
}

/// A stable GUID from the machine's name.
fn node_guid(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    0x0002_c903_0000_0000 | (h & 0xffff_ffff)
}

fn io_out(d: &Devices, port: u16, data: &[u8]) {
    match port {
        COM1..=0x3ff => {
            let _ = d.serial.lock().unwrap().write((port - COM1) as u8, data[0]);
        }
        EXIT_PORT => *d.exit_code.lock().unwrap() = Some(data[0]),
        _ => {
            d.bus.lock().unwrap().io_write(port, data);
        }
    }
}

fn io_in(d: &Devices, port: u16, data: &mut [u8]) {
    match port {
        COM1..=0x3ff => data[0] = d.serial.lock().unwrap().read((port - COM1) as u8),
        _ => {
            if !d.bus.lock().unwrap().io_read(port, data) {
                data.fill(0xff);
            }
        }
    }
}

/// BAR1 (MSI-X) accesses. BAR2 is memory (no exits); BAR0's doorbell writes hit the
/// ioeventfds, and the rest of BAR0 (registers ivshmem leaves at zero, doorbells naming
/// another peer, which ivshmem drops too) reads as zero and ignores writes, like any other
/// address.
fn mmio(d: &Devices, addr: u64, read: Option<&mut [u8]>, write: Option<&[u8]>) {
    let bars = d.hca_pci.lock().unwrap().mapped_bars();
    let mut val = 0u32;
    if let Some(w) = write {
        for (i, b) in w.iter().enumerate().take(4) {
            val |= u32::from(*b) << (8 * i);
        }
    }
    if (bars[1]..bars[1] + BAR1_SIZE).contains(&addr) {
        let off = (addr - bars[1]) & !3;
        match read {
            Some(r) => {
                let v = d.msix.bar_read(off).to_le_bytes();
                for (i, b) in r.iter_mut().enumerate() {
                    *b = v.get(i).copied().unwrap_or(0);
                }
            }
            None => d.msix.bar_write(off, val),
        }
        return;
    }
    if let Some(r) = read {
        r.fill(0);
    }
}

fn vcpu_loop(mut vcpu: VcpuFd, d: &Devices) -> Result<(), String> {
    while !d.stop.load(Ordering::SeqCst) {
        match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => io_out(d, port, data),
            Ok(VcpuExit::IoIn(port, data)) => io_in(d, port, data),
            Ok(VcpuExit::MmioRead(addr, data)) => mmio(d, addr, Some(data), None),
            Ok(VcpuExit::MmioWrite(addr, data)) => mmio(d, addr, None, Some(data)),
            Ok(VcpuExit::Hlt) => return Err("the guest halted with interrupts off".into()),
            Ok(VcpuExit::Shutdown) => return Err("the guest triple-faulted (shutdown)".into()),
            Ok(other) => return Err(format!("unexpected exit: {other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => return Err(format!("KVM_RUN: {e}")),
        }
    }
    Ok(())
}
