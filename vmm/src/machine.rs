//! One KVM virtual machine with an HCA: assembly (RAM, irqchip, PCI bus, serial, the HCA's
//! BARs, doorbell ioeventfds, MSI-X irqfds, read-only virtio-mmio disks) and the vCPU
//! threads with their exit handling.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hca_model::abi::{self, BAR0_DOORBELL, BAR2_SIZE, DOORBELL_PEER_SHIFT, NUM_VECTORS};
use hca_model::sync::Unpoisoned;
use hca_model::Hca;
use hca_model::{DeviceMemory, DoorbellPump};
use hca_model::{Fabric, Lid};
use kvm_ioctls::{IoEventAddress, Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vm_superio::Serial;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use super::boot::{self, BootError};
use super::cpuid::{self, CpuidError};
use super::hca_pci::{HcaPci, Msix, MsixError, BAR1_SIZE};
use super::irq::{GsiRouter, IrqError};
use super::linux::{self, LinuxBoot, LinuxError};
use super::mptable;
use super::pci::{PciBus, TrappedBars};
use super::rtc::{self, Cmos};
use super::serial::{self, ConsoleOut, IrqLine, SerialError, SerialPort};
use super::virtio_blk::{Block, BlockError};
use super::virtio_mmio::{self, MmioTransport, MMIO_SIZE};
use super::virtio_net::{Net, NicConfig, Receiver};

pub const COM1: u16 = 0x3f8;
/// The second UART, as on a PC (IRQ 3): the shell job's command channel (the guest's
/// ttyS1; `hcabench exec` and `cp`), so that the console on COM1 stays the user's.
pub const COM2: u16 = 0x2f8;
/// A 16550's eight registers.
const UART_PORTS: u16 = 8;
/// A byte written here ends the run with that exit code (the test guest's verdict).
pub const EXIT_PORT: u16 = 0x501;
const SERIAL_GSI: u32 = 4;
const COM2_GSI: u32 = 3;
const BAR2_SLOT: u32 = 1;
/// The doorbell peer id this machine's guests must use (one HCA per machine).
const DOORBELL_PEER: u32 = 0;
/// Where the virtio-mmio disks' register pages start, one page each: above the HCA's BARs
/// and the passthrough BAR window, below the IOAPIC.
pub const VIRTIO_MMIO_BASE: u64 = 0xfe00_0000;
/// The disks' interrupts: ISA IRQs no other device of the machine uses (the MP table routes
/// each to its IOAPIC pin), one per disk.
pub const DISK_IRQS: [u32; 4] = [5, 9, 10, 11];
/// The NIC's: another such IRQ. Its register page follows the disks' slots.
pub const NIC_IRQ: u32 = 7;
pub const NIC_MMIO_BASE: u64 = VIRTIO_MMIO_BASE + DISK_IRQS.len() as u64 * MMIO_SIZE;

/// A read-only virtio block device (virtio-mmio) backed by an image file.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub path: PathBuf,
    /// What the guest reads in /sys/block/vdX/serial (at most 20 bytes).
    pub serial: String,
}

/// A disk's registers and where they are.
type Disk = (u64, Mutex<MmioTransport<Block, IrqLine>>);
/// The NIC's registers (shared with its receiving thread).
type Nic = Arc<Mutex<MmioTransport<Net, IrqLine>>>;

pub struct MachineConfig {
    pub name: String,
    /// The HCA's LID on the fabric; its node GUID follows from it ([`abi::node_guid`]).
    pub lid: Lid,
    pub ram_bytes: usize,
    /// 1 to [`mptable::MAX_VCPUS`]; vCPU 0 boots, the others wait for the guest's SIPI.
    pub vcpus: u8,
    /// The serial console's log file (None: kept in memory only).
    pub serial_log: Option<PathBuf>,
    /// A unix socket to attach to the serial console through (`hcabench console`).
    pub console_socket: Option<PathBuf>,
    /// A unix socket for COM2 (None: the port is there, its output goes nowhere).
    pub agent_socket: Option<PathBuf>,
    /// Host PCI functions (sysfs paths, bound to vfio-pci) passed through next to the HCA;
    /// needs the `vfio` build feature.
    pub vfio: Vec<PathBuf>,
    /// Read-only disks, at most [`DISK_IRQS`]`.len()`, announced on the kernel command line
    /// ([`Machine::load_linux`] adds them).
    pub disks: Vec<DiskConfig>,
    /// A virtio-net NIC on the cluster's Ethernet segment (announced as the disks are).
    pub nic: Option<NicConfig>,
}

/// Why a machine could not be built, loaded, started or run to its end.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A VM or vCPU ioctl (named) failed.
    #[error("{0}: {1}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("KVM_CREATE_VCPU {id}: {source}")]
    CreateVcpu { id: u8, source: kvm_ioctls::Error },
    #[error("doorbell ioeventfd (class {class}): {source}")]
    Doorbell {
        class: usize,
        source: kvm_ioctls::Error,
    },
    #[error("BAR2: {0}")]
    Bar2(#[source] vm_memory::mmap::MmapRegionError),
    #[error("{name}: {source}")]
    Attach {
        name: String,
        source: hca_model::LidTaken,
    },
    #[error("eventfd: {0}")]
    Eventfd(#[source] std::io::Error),
    #[error("{0} vCPUs: between 1 and {max} are supported", max = mptable::MAX_VCPUS)]
    Vcpus(u8),
    #[error("{0} disks: at most {max} are supported", max = DISK_IRQS.len())]
    Disks(usize),
    #[error(transparent)]
    Disk(#[from] BlockError),
    #[error("the NIC: {0}")]
    Nic(#[source] std::io::Error),
    #[error("doorbell thread: {0}")]
    DoorbellThread(#[source] std::io::Error),
    #[error("the machine has already started")]
    Started,
    #[error("loading {len} bytes at {addr:#x}: {source}")]
    Load {
        len: usize,
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
    #[error("signal: {0}")]
    Signal(#[source] vmm_sys_util::errno::Error),
    #[error("vcpu thread: {0}")]
    VcpuThread(#[source] std::io::Error),
    /// A vCPU failed before the guest gave an exit code.
    #[error("{name}: {source}\nserial console:\n{serial}")]
    Vcpu {
        name: String,
        source: VcpuError,
        serial: String,
    },
    #[error(
        "passing {} through needs VFIO support, which this hcabench was built without: \
         rebuild with `cargo build --release --features vfio`",
        .0.display()
    )]
    NoVfio(PathBuf),
    #[cfg(feature = "vfio")]
    #[error(transparent)]
    Passthrough(#[from] super::vfio::PassthroughError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Linux(#[from] LinuxError),
    #[error(transparent)]
    Irq(#[from] IrqError),
    #[error(transparent)]
    Msix(#[from] MsixError),
    #[error(transparent)]
    Serial(#[from] SerialError),
    #[error(transparent)]
    Cpuid(#[from] CpuidError),
}

/// Why a vCPU stopped running the guest.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("the guest halted with interrupts off")]
    Halted,
    /// With where the vCPU stood.
    #[error("the guest triple-faulted (shutdown); {0}")]
    TripleFault(String),
    /// With where the vCPU stood.
    #[error(
        "KVM internal error: this host's KVM could not run an instruction (emulation \
         failure); {0}"
    )]
    Internal(String),
    #[error("unexpected exit: {0}")]
    UnexpectedExit(String),
    #[error("KVM_RUN: {0}")]
    Run(#[source] kvm_ioctls::Error),
}

/// What the vCPU threads share.
struct Devices {
    serial: Arc<Mutex<SerialPort>>,
    com2: Arc<Mutex<SerialPort>>,
    rtc: Mutex<Cmos>,
    bus: Mutex<PciBus>,
    hca_pci: Arc<Mutex<HcaPci>>,
    msix: Arc<Msix>,
    hca: Hca,
    /// Passed-through functions, whose trapped BAR ranges exit to them.
    trapped: Vec<Arc<Mutex<dyn TrappedBars>>>,
    disks: Vec<Disk>,
    nic: Option<Nic>,
    exit_code: Mutex<Option<u8>>,
    /// Ends the vCPU loops and the console thread.
    stop: Arc<AtomicBool>,
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
    ram_bytes: u64,
    /// The disks' `virtio_mmio.device=` parameters.
    disk_cmdline: String,
    devices: Arc<Devices>,
    console: Arc<Mutex<Vec<u8>>>,
    doorbell_pump: Option<DoorbellPump>,
    /// Takes the NIC's frames from the segment (stops when dropped).
    nic_receiver: Option<Receiver>,
    console_thread: Option<JoinHandle<()>>,
    com2_thread: Option<JoinHandle<()>>,
    vcpu_threads: Vec<JoinHandle<Result<(), VcpuError>>>,
    started: Option<Instant>,
}

/// Registers (or with `remove`, unregisters) the doorbell ioeventfds at a BAR0 base.
fn doorbell_ioevents(
    vm: &VmFd,
    fds: &[EventFd],
    bar0: u64,
    remove: bool,
) -> Result<(), MachineError> {
    let addr = IoEventAddress::Mmio(bar0 + u64::from(BAR0_DOORBELL));
    for (class, fd) in fds.iter().enumerate() {
        let value = DOORBELL_PEER << DOORBELL_PEER_SHIFT | class as u32;
        let r = if remove {
            vm.unregister_ioevent(fd, &addr, value)
        } else {
            vm.register_ioevent(fd, &addr, value)
        };
        r.map_err(|source| MachineError::Doorbell { class, source })?;
    }
    Ok(())
}

extern "C" fn kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

impl Machine {
    /// A VM with `cfg.ram_bytes` of RAM, `cfg.vcpus` vCPUs and an HCA attached to `fabric`.
    pub fn new(kvm: &Kvm, cfg: MachineConfig, fabric: &Fabric) -> Result<Machine, MachineError> {
        let vm = Arc::new(
            kvm.create_vm()
                .map_err(|e| MachineError::Kvm("KVM_CREATE_VM", e))?,
        );
        vm.set_tss_address(0xfffb_d000)
            .map_err(|e| MachineError::Kvm("KVM_SET_TSS_ADDR", e))?;
        vm.create_irq_chip()
            .map_err(|e| MachineError::Kvm("KVM_CREATE_IRQCHIP", e))?;
        // The 8254 timer, which Linux calibrates against and uses until the LAPIC timer.
        vm.create_pit2(kvm_bindings::kvm_pit_config {
            flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        })
        .map_err(|e| MachineError::Kvm("KVM_CREATE_PIT2", e))?;
        let mem = boot::guest_ram(cfg.ram_bytes)?;
        boot::map_ram(&vm, &mem)?;

        let bar2 = DeviceMemory::new().map_err(MachineError::Bar2)?;
        let router = GsiRouter::new(vm.clone())?;
        let msix = Msix::new(router.clone())?;
        let hca = Hca::new(mem.clone(), bar2, msix.clone(), abi::node_guid(cfg.lid));
        hca.set_doorbell_peer(DOORBELL_PEER);
        hca.attach_at(fabric, cfg.lid)
            .map_err(|source| MachineError::Attach {
                name: cfg.name.clone(),
                source,
            })?;

        let fds: Arc<Vec<EventFd>> = Arc::new(
            (0..NUM_VECTORS)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Eventfd))
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
                        boot::map_slot(&vm, BAR2_SLOT, old, 0, bar2_host)
                            .and_then(|_| {
                                boot::map_slot(&vm, BAR2_SLOT, new, u64::from(BAR2_SIZE), bar2_host)
                            })
                            .map_err(MachineError::from)
                    },
                    _ => Ok(()),
                };
                if let Err(e) = r {
                    log::error!("moving BAR{bar} to {new:#x}: {e}");
                }
            })
        };
        let hca_pci = Arc::new(Mutex::new(HcaPci::new(msix.clone(), on_move)));
        let bars = hca_pci.lock_unpoisoned().mapped_bars();
        doorbell_ioevents(&vm, &fds, bars[0], false)?;
        // SAFETY: as above.
        unsafe { boot::map_slot(&vm, BAR2_SLOT, bars[2], u64::from(BAR2_SIZE), bar2_host)? };
        let mut bus = PciBus::new();
        bus.add(hca_pci.clone());
        let trapped = passthrough(&cfg, &vm, &router, &mem, &mut bus)?;

        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Eventfd)?;
        vm.register_irqfd(&serial_irq, SERIAL_GSI)
            .map_err(|e| MachineError::Kvm("serial irqfd", e))?;
        let out = ConsoleOut::new(cfg.serial_log.as_deref())?;
        let console = out.captured();
        let serial = Arc::new(Mutex::new(Serial::new(IrqLine(serial_irq), out)));
        let stop = Arc::new(AtomicBool::new(false));
        let console_thread = match &cfg.console_socket {
            Some(p) => Some(serial::serve(p, "console", serial.clone(), stop.clone())?),
            None => None,
        };
        let com2_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Eventfd)?;
        vm.register_irqfd(&com2_irq, COM2_GSI)
            .map_err(|e| MachineError::Kvm("COM2 irqfd", e))?;
        let com2 = Arc::new(Mutex::new(Serial::new(
            IrqLine(com2_irq),
            ConsoleOut::socket_only(),
        )));
        let com2_thread = match &cfg.agent_socket {
            Some(p) => Some(serial::serve(p, "com2", com2.clone(), stop.clone())?),
            None => None,
        };

        let (disks, mut disk_cmdline) = disks(&vm, &mem, &cfg.disks)?;
        let nic = match &cfg.nic {
            Some(n) => Some(nic(&vm, &mem, n)?),
            None => None,
        };
        let nic_receiver = match &nic {
            Some(t) => {
                disk_cmdline.push_str(&format!(
                    "{}{}",
                    if disk_cmdline.is_empty() { "" } else { " " },
                    virtio_mmio::cmdline(NIC_MMIO_BASE, NIC_IRQ)
                ));
                Some(Receiver::start(&cfg.name, t.clone()).map_err(MachineError::Nic)?)
            }
            None => None,
        };

        if cfg.vcpus == 0 || cfg.vcpus > mptable::MAX_VCPUS {
            return Err(MachineError::Vcpus(cfg.vcpus));
        }
        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| MachineError::Kvm("KVM_GET_SUPPORTED_CPUID", e))?;
        let tsc_deadline = kvm.check_extension(kvm_ioctls::Cap::TscDeadlineTimer);
        let vcpus = (0..cfg.vcpus)
            .map(|id| new_vcpu(&vm, &cpuid, id, tsc_deadline))
            .collect::<Result<Vec<_>, _>>()?;

        let pump_fds = fds
            .iter()
            .map(EventFd::try_clone)
            .collect::<Result<Vec<_>, _>>()
            .map_err(MachineError::Eventfd)?;
        let doorbell_pump = DoorbellPump::start(&cfg.name, hca.clone(), pump_fds)
            .map_err(MachineError::DoorbellThread)?;
        Ok(Machine {
            name: cfg.name,
            devices: Arc::new(Devices {
                serial,
                com2,
                rtc: Mutex::new(Cmos::default()),
                bus: Mutex::new(bus),
                hca_pci,
                msix,
                hca,
                trapped,
                disks,
                nic,
                exit_code: Mutex::new(None),
                stop,
            }),
            _vm: vm,
            mem,
            vcpus,
            ram_bytes: cfg.ram_bytes as u64,
            disk_cmdline,
            console,
            doorbell_pump: Some(doorbell_pump),
            nic_receiver,
            console_thread,
            com2_thread,
            vcpu_threads: Vec::new(),
            started: None,
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
    pub fn load_flat(&self, blob: &[u8], addr: u64, stack: u64) -> Result<(), MachineError> {
        let bsp = self.vcpus.first().ok_or(MachineError::Started)?;
        self.mem
            .write_slice(blob, GuestAddress(addr))
            .map_err(|source| MachineError::Load {
                len: blob.len(),
                addr,
                source,
            })?;
        Ok(boot::enter_long_mode(&self.mem, bsp, addr, stack)?)
    }

    /// Loads a Linux kernel (bzImage), its initramfs and command line (with the disks'
    /// `virtio_mmio.device=` parameters added), and the platform tables, and puts vCPU 0 at
    /// the kernel's 64-bit entry point.
    pub fn load_linux(&self, what: &LinuxBoot) -> Result<(), MachineError> {
        let bsp = self.vcpus.first().ok_or(MachineError::Started)?;
        let vcpus = self.vcpus.len() as u8;
        let mut what = what.clone();
        if !self.disk_cmdline.is_empty() {
            what.cmdline = format!("{} {}", what.cmdline, self.disk_cmdline);
        }
        Ok(linux::load(&self.mem, self.ram_bytes, vcpus, bsp, &what)?)
    }

    /// Runs the vCPUs (a thread each) until the guest writes [`EXIT_PORT`], a vCPU fails,
    /// or `timeout` passes.
    pub fn run(&mut self, timeout: Duration) -> Result<Outcome, MachineError> {
        self.start()?;
        self.wait(timeout, |_| false)
    }

    /// Starts a thread per vCPU.
    pub fn start(&mut self) -> Result<(), MachineError> {
        register_signal_handler(SIGRTMIN(), kick).map_err(MachineError::Signal)?;
        self.started = Some(Instant::now());
        for (i, vcpu) in std::mem::take(&mut self.vcpus).into_iter().enumerate() {
            let d = self.devices.clone();
            self.vcpu_threads.push(
                std::thread::Builder::new()
                    .name(format!("{}-vcpu{i}", self.name))
                    .spawn(move || vcpu_loop(vcpu, &d))
                    .map_err(MachineError::VcpuThread)?,
            );
        }
        Ok(())
    }

    /// Whether the guest is still running: it has not written [`EXIT_PORT`] and no vCPU
    /// has failed.
    pub fn running(&self) -> bool {
        self.devices.exit_code.lock_unpoisoned().is_none()
            && !self.vcpu_threads.is_empty()
            && self.vcpu_threads.iter().all(|t| !t.is_finished())
    }

    /// Time since the vCPUs started.
    pub fn uptime(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// Whether a client is attached to the console socket.
    pub fn console_attached(&self) -> bool {
        self.devices.serial.lock_unpoisoned().writer().attached()
    }

    /// The serial output so far (its first MiB).
    pub fn serial_text(&self) -> String {
        serial_text(&self.console)
    }

    /// A reader of the serial output that does not borrow the machine.
    pub fn serial_reader(&self) -> impl Fn() -> String + Send + 'static {
        let buf = self.console.clone();
        move || serial_text(&buf)
    }

    /// Waits until the guest stops running, `until` holds for its serial output, or
    /// `timeout` passes; then stops it.
    pub fn wait(
        &mut self,
        timeout: Duration,
        until: impl Fn(&str) -> bool,
    ) -> Result<Outcome, MachineError> {
        let deadline = Instant::now() + timeout;
        while self.running() && Instant::now() < deadline && !until(&self.serial_text()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop()
    }

    /// Stops the vCPUs and reports how the run ended: an error if a vCPU failed before the
    /// guest gave an exit code.
    pub fn stop(&mut self) -> Result<Outcome, MachineError> {
        self.devices.stop.store(true, Ordering::SeqCst);
        let mut err = None;
        for t in std::mem::take(&mut self.vcpu_threads) {
            // Kick a vCPU out of KVM_RUN until it sees `stop`.
            while !t.is_finished() {
                use std::os::unix::thread::JoinHandleExt;
                // SAFETY: the thread is alive (not finished, not joined) and our
                // handler for the signal does nothing.
                unsafe { libc::pthread_kill(t.as_pthread_t(), SIGRTMIN()) };
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Ok(Err(e)) = t.join() {
                err.get_or_insert(e);
            }
        }
        let exit_code = *self.devices.exit_code.lock_unpoisoned();
        let serial = self.serial_text();
        if let (None, Some(e)) = (exit_code, err) {
            return Err(MachineError::Vcpu {
                name: self.name.clone(),
                source: e,
                serial,
            });
        }
        Ok(Outcome {
            exit_code,
            serial,
            elapsed: self.started.map(|s| s.elapsed()).unwrap_or_default(),
        })
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if !self.vcpu_threads.is_empty() {
            let _ = self.stop();
        }
        self.devices.stop.store(true, Ordering::SeqCst);
        for t in [self.console_thread.take(), self.com2_thread.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
        drop(self.doorbell_pump.take());
        drop(self.nic_receiver.take());
        self.devices.hca.detach();
    }
}

/// The host functions `cfg.vfio` names, on `bus` after the HCA.
#[cfg(feature = "vfio")]
fn passthrough(
    cfg: &MachineConfig,
    vm: &Arc<VmFd>,
    router: &Arc<GsiRouter>,
    mem: &GuestMemoryMmap,
    bus: &mut PciBus,
) -> Result<Vec<Arc<Mutex<dyn TrappedBars>>>, MachineError> {
    let mut next_slot = BAR2_SLOT + 1;
    let mut trapped: Vec<Arc<Mutex<dyn TrappedBars>>> = Vec::new();
    for path in &cfg.vfio {
        let f = super::vfio::VfioPci::new(path, vm.clone(), router.clone(), mem, &mut next_slot)?;
        let f = Arc::new(Mutex::new(f));
        bus.add(f.clone());
        trapped.push(f);
    }
    Ok(trapped)
}

#[cfg(not(feature = "vfio"))]
fn passthrough(
    cfg: &MachineConfig,
    _: &Arc<VmFd>,
    _: &Arc<GsiRouter>,
    _: &GuestMemoryMmap,
    _: &mut PciBus,
) -> Result<Vec<Arc<Mutex<dyn TrappedBars>>>, MachineError> {
    match cfg.vfio.first() {
        Some(p) => Err(MachineError::NoVfio(p.clone())),
        None => Ok(Vec::new()),
    }
}

/// The disks `cfg` names, each opened read-only behind a virtio-mmio page with an irqfd on
/// its IRQ; and their kernel parameters.
fn disks(
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    cfg: &[DiskConfig],
) -> Result<(Vec<Disk>, String), MachineError> {
    if cfg.len() > DISK_IRQS.len() {
        return Err(MachineError::Disks(cfg.len()));
    }
    let mut disks = Vec::new();
    let mut cmdline = Vec::new();
    for ((i, d), &irq) in cfg.iter().enumerate().zip(&DISK_IRQS) {
        let block = Block::open(&d.path, &d.serial)?;
        let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Eventfd)?;
        vm.register_irqfd(&fd, irq)
            .map_err(|e| MachineError::Kvm("disk irqfd", e))?;
        let base = VIRTIO_MMIO_BASE + i as u64 * MMIO_SIZE;
        cmdline.push(virtio_mmio::cmdline(base, irq));
        let t = MmioTransport::new(block, mem.clone(), IrqLine(fd));
        disks.push((base, Mutex::new(t)));
    }
    Ok((disks, cmdline.join(" ")))
}

/// The NIC `cfg` describes, behind a virtio-mmio page at [`NIC_MMIO_BASE`] with an irqfd
/// on [`NIC_IRQ`].
fn nic(vm: &VmFd, mem: &GuestMemoryMmap, cfg: &NicConfig) -> Result<Nic, MachineError> {
    let net = Net::new(*cfg).map_err(MachineError::Nic)?;
    let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Eventfd)?;
    vm.register_irqfd(&fd, NIC_IRQ)
        .map_err(|e| MachineError::Kvm("NIC irqfd", e))?;
    Ok(Arc::new(Mutex::new(MmioTransport::new(
        net,
        mem.clone(),
        IrqLine(fd),
    ))))
}

/// vCPU `id` with local APIC ID `id` and the paravirtual leaves in its CPUID ([`cpuid`]),
/// and its LAPIC in virtual-wire mode (LINT0 ExtINT, LINT1 NMI) as firmware would leave it.
fn new_vcpu(
    vm: &VmFd,
    supported: &kvm_bindings::CpuId,
    id: u8,
    tsc_deadline: bool,
) -> Result<VcpuFd, MachineError> {
    let vcpu = vm
        .create_vcpu(u64::from(id))
        .map_err(|source| MachineError::CreateVcpu { id, source })?;
    let cpuid = cpuid::for_vcpu(supported, id, tsc_deadline)?;
    vcpu.set_cpuid2(&cpuid)
        .map_err(|e| MachineError::Kvm("KVM_SET_CPUID2", e))?;
    let mut lapic = vcpu
        .get_lapic()
        .map_err(|e| MachineError::Kvm("KVM_GET_LAPIC", e))?;
    let mut set_lvt = |off: usize, mode: u32| {
        let b: &mut [u8] = lapic_bytes(&mut lapic);
        if let Some(reg) = b.get_mut(off..off + 4) {
            let mut v = u32::from_le_bytes(reg.try_into().unwrap_or_default());
            v = (v & !0x700) | mode << 8;
            reg.copy_from_slice(&v.to_le_bytes());
        }
    };
    set_lvt(0x350, 7); // LVT LINT0: ExtINT
    set_lvt(0x360, 4); // LVT LINT1: NMI
    vcpu.set_lapic(&lapic)
        .map_err(|e| MachineError::Kvm("KVM_SET_LAPIC", e))?;
    let fpu = kvm_bindings::kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu)
        .map_err(|e| MachineError::Kvm("KVM_SET_FPU", e))?;
    Ok(vcpu)
}

/// The LAPIC register page as bytes (kvm_lapic_state holds it as `c_char`s).
fn lapic_bytes(l: &mut kvm_bindings::kvm_lapic_state) -> &mut [u8] {
    // SAFETY: i8 and u8 have the same size and alignment; the borrow covers the array.
    unsafe { std::slice::from_raw_parts_mut(l.regs.as_mut_ptr().cast::<u8>(), l.regs.len()) }
}

/// The captured serial output as text.
fn serial_text(buf: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&buf.lock_unpoisoned()).into_owned()
}

/// Which of the two UARTs a port number falls in, and the register there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Uart {
    Com1(u8),
    Com2(u8),
}

fn uart_at(port: u16) -> Option<Uart> {
    let reg = |base: u16| {
        let off = port.checked_sub(base).filter(|&o| o < UART_PORTS)?;
        u8::try_from(off).ok()
    };
    reg(COM1)
        .map(Uart::Com1)
        .or_else(|| reg(COM2).map(Uart::Com2))
}

impl Devices {
    fn uart(&self, u: Uart) -> (&Mutex<SerialPort>, u8) {
        match u {
            Uart::Com1(reg) => (&self.serial, reg),
            Uart::Com2(reg) => (&self.com2, reg),
        }
    }
}

fn io_out(d: &Devices, port: u16, data: &[u8]) {
    // KVM hands over 1, 2 or 4 bytes; the byte-wide devices take the first.
    let byte = data.first().copied().unwrap_or(0);
    if let Some(u) = uart_at(port) {
        let (uart, reg) = d.uart(u);
        let _ = uart.lock_unpoisoned().write(reg, byte);
        return;
    }
    match port {
        EXIT_PORT => *d.exit_code.lock_unpoisoned() = Some(byte),
        rtc::PORT_INDEX | rtc::PORT_DATA => d.rtc.lock_unpoisoned().write(port, byte),
        _ => {
            d.bus.lock_unpoisoned().io_write(port, data);
        }
    }
}

fn io_in(d: &Devices, port: u16, data: &mut [u8]) {
    let byte = |v: u8, data: &mut [u8]| {
        if let Some(b) = data.first_mut() {
            *b = v;
        }
    };
    if let Some(u) = uart_at(port) {
        let (uart, reg) = d.uart(u);
        byte(uart.lock_unpoisoned().read(reg), data);
        return;
    }
    match port {
        rtc::PORT_INDEX | rtc::PORT_DATA => byte(d.rtc.lock_unpoisoned().read(port), data),
        _ => {
            if !d.bus.lock_unpoisoned().io_read(port, data) {
                data.fill(0xff);
            }
        }
    }
}

/// BAR1 (MSI-X) accesses, passed-through functions' trapped BARs and the disks'
/// virtio-mmio pages. BAR2 is memory (no exits); BAR0's doorbell writes hit the
/// ioeventfds, and the rest of BAR0 (registers ivshmem leaves at zero, doorbells naming
/// another peer, which ivshmem drops too) reads as zero and ignores writes, like any other
/// address.
fn mmio(d: &Devices, addr: u64, mut read: Option<&mut [u8]>, write: Option<&[u8]>) {
    let bars = d.hca_pci.lock_unpoisoned().mapped_bars();
    if (bars[1]..bars[1] + BAR1_SIZE).contains(&addr) {
        let len = read
            .as_deref()
            .map_or(write.map_or(0, <[u8]>::len), <[u8]>::len);
        let dwords = crate::hca_pci::msix_dwords(addr - bars[1], len);
        match read.as_deref_mut() {
            Some(r) => {
                r.fill(0);
                for (dword, off) in r.chunks_exact_mut(4).zip(dwords) {
                    dword.copy_from_slice(&d.msix.bar_read(off).to_le_bytes());
                }
            }
            None => {
                let w = write.unwrap_or_default();
                for (dword, off) in w.chunks_exact(4).zip(dwords) {
                    let v = u32::from_le_bytes(dword.try_into().unwrap_or_default());
                    d.msix.bar_write(off, v);
                }
            }
        }
        return;
    }
    for f in &d.trapped {
        if f.lock_unpoisoned().mmio(addr, read.as_deref_mut(), write) {
            return;
        }
    }
    for (base, disk) in &d.disks {
        if let Some(off) = addr.checked_sub(*base).filter(|&o| o < MMIO_SIZE) {
            let mut disk = disk.lock_unpoisoned();
            match read {
                Some(r) => disk.read(off, r),
                None => disk.write(off, write.unwrap_or_default()),
            }
            return;
        }
    }
    if let Some(nic) = &d.nic {
        if let Some(off) = addr.checked_sub(NIC_MMIO_BASE).filter(|&o| o < MMIO_SIZE) {
            let mut nic = nic.lock_unpoisoned();
            match read {
                Some(r) => nic.read(off, r),
                None => nic.write(off, write.unwrap_or_default()),
            }
            return;
        }
    }
    if let Some(r) = read {
        r.fill(0);
    }
}

/// Where a vCPU stood when it stopped, for the error a user reads: the instruction pointer
/// and the control registers say how far the kernel got (real mode, paging on, long mode).
fn vcpu_state(vcpu: &VcpuFd) -> String {
    match (vcpu.get_regs(), vcpu.get_sregs()) {
        // After a shutdown intercept, KVM on AMD resets the vCPU (SVM leaves its state
        // undefined), so the reset vector says nothing about where the guest failed.
        (Ok(r), Ok(s)) if r.rip == 0xfff0 && s.cs.selector == 0xf000 => {
            "the vCPU was reset by KVM (on AMD the faulting state is not kept; the console \
             shows how far the kernel got)"
                .into()
        }
        (Ok(r), Ok(s)) => format!(
            "vCPU at rip={:#x} rsp={:#x} cs={:#x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} \
             efer={:#x}",
            r.rip, r.rsp, s.cs.selector, s.cr0, s.cr2, s.cr3, s.cr4, s.efer
        ),
        (Err(e), _) | (_, Err(e)) => format!("vCPU state unreadable ({e})"),
    }
}

fn vcpu_loop(mut vcpu: VcpuFd, d: &Devices) -> Result<(), VcpuError> {
    while !d.stop.load(Ordering::SeqCst) {
        match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => io_out(d, port, data),
            Ok(VcpuExit::IoIn(port, data)) => io_in(d, port, data),
            Ok(VcpuExit::MmioRead(addr, data)) => mmio(d, addr, Some(data), None),
            Ok(VcpuExit::MmioWrite(addr, data)) => mmio(d, addr, None, Some(data)),
            Ok(VcpuExit::Hlt) => return Err(VcpuError::Halted),
            Ok(VcpuExit::Shutdown) => return Err(VcpuError::TripleFault(vcpu_state(&vcpu))),
            Ok(VcpuExit::InternalError) => return Err(VcpuError::Internal(vcpu_state(&vcpu))),
            Ok(other) => return Err(VcpuError::UnexpectedExit(format!("{other:?}"))),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => return Err(VcpuError::Run(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_port_numbers_reach_the_uart_they_belong_to_and_no_other() {
        assert_eq!(uart_at(COM1), Some(Uart::Com1(0)));
        assert_eq!(uart_at(0x3fd), Some(Uart::Com1(5)));
        assert_eq!(uart_at(0x3ff), Some(Uart::Com1(7)));
        assert_eq!(uart_at(COM2), Some(Uart::Com2(0)));
        assert_eq!(uart_at(0x2ff), Some(Uart::Com2(7)));
        for other in [0x2f7, 0x300, 0x3f7, 0x400, EXIT_PORT, 0, u16::MAX] {
            assert_eq!(uart_at(other), None, "{other:#x}");
        }
    }
}
