//! The device server against stand-ins for QEMU: each fake guest connects to its node's
//! socket, reads the ivshmem greeting, maps BAR2 from the memfd it receives, rings doorbells
//! on the device's eventfds, waits for interrupts on its own, and keeps its "RAM" in a file
//! as QEMU's memory-backend-file does.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use device_server::ivshmem::{read_greeting, ClientView};
use device_server::{DeviceServer, NodeConfig, RamBacking, DEVICE_PEER, GUEST_PEER};
use hca_model::abi::*;
use hca_model::DeviceMemory;
use hca_test_driver::{send_wr, sge, CqH, Driver, Port, QpH};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};

const RAM: u64 = 8 << 20;
const WAIT: Duration = Duration::from_secs(10);

/// A directory for one test's sockets and RAM files, removed when the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("hcab-ds-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// `n` nodes, their RAM sealed memfds (what clusters use).
fn configs(dir: &Path, n: usize) -> Vec<NodeConfig> {
    NodeConfig::cluster(dir, &vec![RAM; n]).unwrap()
}

/// `n` nodes, their RAM files that QEMU creates (a QEMU started by someone else).
fn configs_with_ram_files(dir: &Path, n: usize) -> Vec<NodeConfig> {
    let mut c = configs(dir, n);
    for n in &mut c {
        n.ram = RamBacking::Path(dir.join(format!("{}.ram", n.name)));
    }
    c
}

/// The device as a QEMU guest reaches it: BAR2 mapped from the memfd the greeting carried,
/// doorbells as writes to the device's eventfds.
struct Ivshmem {
    bar2: DeviceMemory,
    doorbells: Vec<File>,
}

impl Port for Ivshmem {
    const SYNCHRONOUS: bool = false;
    fn bar2(&self) -> &DeviceMemory {
        &self.bar2
    }
    /// A BAR0 doorbell write of `peer << 16 | class`, as QEMU turns it into an eventfd write.
    fn doorbell(&self, class: u32) {
        (&self.doorbells[class as usize])
            .write_all(&1u64.to_ne_bytes())
            .unwrap();
    }
}

struct FakeGuest {
    _sock: UnixStream,
    view: ClientView,
    cfg: NodeConfig,
}

impl FakeGuest {
    fn connect(cfg: &NodeConfig) -> Self {
        let sock = UnixStream::connect(&cfg.socket).expect("connect to the node socket");
        let view = read_greeting(&sock, NUM_VECTORS as usize).expect("greeting");
        FakeGuest {
            _sock: sock,
            view,
            cfg: cfg.clone(),
        }
    }

    /// The guest's driver over `mem`, its view of its RAM.
    fn driver(&self, mem: GuestMemoryMmap) -> Driver<Ivshmem> {
        let port = Ivshmem {
            bar2: DeviceMemory::from_file(self.view.shm.try_clone().unwrap()).unwrap(),
            doorbells: self.view.peers[0]
                .1
                .iter()
                .map(|f| f.try_clone().unwrap())
                .collect(),
        };
        Driver::with_port(port, mem)
    }

    /// What QEMU does when it creates the RAM backend (after connecting): it maps the
    /// memfd it inherited, or creates and sizes the file.
    fn create_ram(&self) -> GuestMemoryMmap {
        let f = match &self.cfg.ram {
            RamBacking::Memfd(f) => f.try_clone().unwrap(),
            RamBacking::Path(p) => {
                let f = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p)
                    .unwrap();
                f.set_len(RAM).unwrap();
                f
            }
        };
        GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            RAM as usize,
            Some(FileOffset::new(f, 0)),
        )])
        .unwrap()
    }

    fn info(&self) -> HcaDevInfo {
        DeviceMemory::from_file(self.view.shm.try_clone().unwrap())
            .unwrap()
            .read_obj(BAR2_INFO_OFFSET)
    }

    /// Waits for MSI-X vector `v` (the eventfd QEMU would turn into it).
    fn wait_irq(&self, v: u32) -> bool {
        let deadline = Instant::now() + WAIT;
        let mut b = [0u8; 8];
        while Instant::now() < deadline {
            if (&self.view.own[v as usize]).read(&mut b).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

#[test]
fn test_greeting_follows_the_ivshmem_protocol_and_bar2_names_the_node() {
    let dir = scratch("greet");
    let cfgs = configs(&dir.0, 2);
    let server = DeviceServer::start(cfgs.clone()).unwrap();
    // Connect in reverse order: identity comes from the socket, not from connect order.
    let g2 = FakeGuest::connect(&cfgs[1]);
    let g1 = FakeGuest::connect(&cfgs[0]);
    for (g, lid) in [(&g1, 1), (&g2, 2)] {
        assert_eq!(g.view.id, GUEST_PEER);
        assert_eq!(g.view.peers.len(), 1);
        assert_eq!(g.view.peers[0].0, DEVICE_PEER);
        assert_eq!(g.view.peers[0].1.len(), NUM_VECTORS as usize);
        assert_eq!(g.view.own.len(), NUM_VECTORS as usize);
        let info = g.info();
        assert_eq!((info.signature, info.abi_version), (SIGNATURE, ABI_VERSION));
        assert_eq!((info.lid, u32::from(info.port_state)), (lid, PORT_ACTIVE));
        assert_eq!(info.doorbell_peer, u32::from(DEVICE_PEER));
        // BAR2's size is sealed: a guest's side cannot truncate it under the server.
        let e = g.view.shm.set_len(0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        assert!(g.view.shm.set_len(1 << 30).is_err());
    }
    server.shutdown().unwrap();
    assert!(!cfgs[0].socket.exists(), "shutdown removes the sockets");
}

#[test]
fn test_doorbell_reaches_the_model_and_its_interrupt_comes_back() {
    let dir = scratch("irq");
    let cfgs = configs(&dir.0, 1);
    let _server = DeviceServer::start(cfgs.clone()).unwrap();
    let g = FakeGuest::connect(&cfgs[0]);
    assert!(g.wait_irq(VEC_ASYNC), "port-active event raised vector 0");
    let mut d = g.driver(scratch_ram());
    let (st, out) = d.cmd_raw(CMD_ALLOC_PD, &[], CMD_FLAG_EVENT);
    assert_eq!((st, out[0]), (CMD_OK, 1));
    assert!(g.wait_irq(VEC_ASYNC), "command completion raised vector 0");
}

#[test]
fn test_guest_ram_is_mapped_once_qemu_has_created_it() {
    let dir = scratch("ram");
    let cfgs = configs_with_ram_files(&dir.0, 1);
    let _server = DeviceServer::start(cfgs.clone()).unwrap();
    let g = FakeGuest::connect(&cfgs[0]);
    // Before QEMU creates the RAM file the driver's view of RAM is its own scratch memory.
    let mut early = g.driver(scratch_ram());
    let cq = HcaCmdCreateCq {
        ring_addr: 0x10_0000,
        log_entries: 4,
        vector: 1,
        ..Default::default()
    };
    assert_eq!(
        early.cmd(CMD_CREATE_CQ, &cq).0,
        CMD_BAD_ADDRESS,
        "no RAM file yet"
    );
    let ram = g.create_ram();
    ram.write_slice(&[0xee; 512], GuestAddress(0x10_0000))
        .unwrap();
    let mut d = g.driver(ram.clone());
    assert_eq!(d.cmd(CMD_CREATE_CQ, &cq).0, CMD_OK);
    let mut ring = [1u8; 512];
    ram.read_slice(&mut ring, GuestAddress(0x10_0000)).unwrap();
    assert_eq!(
        ring, [0u8; 512],
        "the device zeroed the ring in the guest's RAM file"
    );
    let beyond = HcaCmdCreateCq {
        ring_addr: RAM - 64,
        ..cq
    };
    assert_eq!(d.cmd(CMD_CREATE_CQ, &beyond).0, CMD_BAD_ADDRESS);
}

/// One guest's RC endpoint: its driver, the DMA MR's key, CQ and QP.
struct Endpoint {
    d: Driver<Ivshmem>,
    key: u32,
    cq: CqH,
    qp: QpH,
}

/// Sets up PD, physical MR, CQ and an RC QP in `g`'s RAM file.
fn rc_endpoint(g: &FakeGuest) -> Endpoint {
    let mut d = g.driver(g.create_ram());
    let pd = d.alloc_pd();
    let key = d.reg_dma_mr(pd, ACCESS);
    let cq = d.create_cq(4);
    let qp = d.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    Endpoint { d, key, cq, qp }
}

const ACCESS: u32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

/// Posts an RDMA WRITE of `len` bytes from `src` to the peer's `dst` and waits for its CQE.
fn rdma_write(e: &mut Endpoint, (src, dst, rkey, len): (u64, u64, u32, u32)) -> HcaCqe {
    let wqe = HcaSendWqe {
        remote_addr: dst,
        rkey,
        ..send_wr(77, WR_RDMA_WRITE, WQE_SIGNALED)
    };
    e.d.post_send(&mut e.qp, wqe, &[sge(src, len, e.key)]);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(c) = e.d.poll_cq(&mut e.cq) {
            return c;
        }
        assert!(Instant::now() < deadline, "no CQE for the RDMA WRITE");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A server with two guests whose RC QPs are connected to each other.
struct TwoGuests {
    server: DeviceServer,
    a: Endpoint,
    b: Endpoint,
    /// node2's QEMU: dropping it is node2 dying.
    gb: FakeGuest,
    _ga: FakeGuest,
    dir: Scratch,
}

fn two_connected_guests(name: &str) -> TwoGuests {
    let dir = scratch(name);
    let cfgs = configs(&dir.0, 2);
    let server = DeviceServer::start(cfgs.clone()).unwrap();
    let ga = FakeGuest::connect(&cfgs[0]);
    let gb = FakeGuest::connect(&cfgs[1]);
    let (mut a, mut b) = (rc_endpoint(&ga), rc_endpoint(&gb));
    let (qa, qb) = (a.qp.qpn, b.qp.qpn);
    a.d.bring_up_rc(qa, 2, qb, ACCESS, MTU_4096 as u8);
    b.d.bring_up_rc(qb, 1, qa, ACCESS, MTU_4096 as u8);
    TwoGuests {
        server,
        a,
        b,
        gb,
        _ga: ga,
        dir,
    }
}

/// Anonymous memory for a driver whose guest has no RAM file yet.
fn scratch_ram() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap()
}

#[test]
fn test_rdma_write_goes_from_one_guest_ram_file_into_another() {
    let mut g = two_connected_guests("rdma");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let len = data.len() as u64;
    let (src, dst) = (g.a.d.alloc(len, 4096), g.b.d.alloc(len, 4096));
    g.a.d.write(src, &data);
    let c = rdma_write(&mut g.a, (src, dst, g.b.key, len as u32));
    assert_eq!((u32::from(c.status), c.wr_id), (WC_SUCCESS, 77));
    assert_eq!(g.b.d.read(dst, data.len()), data);
}

#[test]
fn test_a_dead_guest_takes_only_its_own_hca_down() {
    let mut g = two_connected_guests("kill");
    let cfgs = configs(&g.dir.0, 2);

    drop(g.gb); // node2's QEMU dies
    let deadline = Instant::now() + WAIT;
    while g.server.hca(1).is_some() {
        assert!(
            Instant::now() < deadline,
            "the server never noticed the guest left"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // node1 sees an error completion for its connection to the dead node, and goes on.
    let (src, dst) = (g.a.d.alloc(64, 64), g.b.d.alloc(64, 64));
    let c = rdma_write(&mut g.a, (src, dst, g.b.key, 64));
    assert_eq!(u32::from(c.status), WC_RETRY_EXC_ERR);
    assert_eq!(
        g.a.d.cmd_raw(CMD_QUERY_PORT, &[], 0).0,
        CMD_OK,
        "node1 still served"
    );

    // node2 boots again: a fresh device at its old LID.
    let b2 = FakeGuest::connect(&cfgs[1]);
    let info = b2.info();
    assert_eq!((info.lid, u32::from(info.port_state)), (2, PORT_ACTIVE));
    assert_eq!(g.server.fabric().stats().no_route, 1);
}
