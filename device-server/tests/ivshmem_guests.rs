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
use device_server::{DeviceServer, NodeConfig, DEVICE_PEER, GUEST_PEER};
use hca_model::abi::*;
use hca_model::DeviceMemory;
use vm_memory::{ByteValued, Bytes, FileOffset, GuestAddress, GuestMemoryMmap};

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

fn configs(dir: &Path, n: usize) -> Vec<NodeConfig> {
    NodeConfig::cluster(dir, n, RAM)
}

struct FakeGuest {
    _sock: UnixStream,
    view: ClientView,
    bar2: DeviceMemory,
    cfg: NodeConfig,
    seq: u32,
}

impl FakeGuest {
    fn connect(cfg: &NodeConfig) -> Self {
        let sock = UnixStream::connect(&cfg.socket).expect("connect to the node socket");
        let view = read_greeting(&sock, NUM_VECTORS as usize).expect("greeting");
        let bar2 = DeviceMemory::from_file(view.shm.try_clone().unwrap()).unwrap();
        FakeGuest {
            _sock: sock,
            view,
            bar2,
            cfg: cfg.clone(),
            seq: 0,
        }
    }

    /// What QEMU does when it creates the RAM backend (after connecting).
    fn create_ram(&self) -> GuestMemoryMmap {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.cfg.ram_path)
            .unwrap();
        f.set_len(RAM).unwrap();
        GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            RAM as usize,
            Some(FileOffset::new(f, 0)),
        )])
        .unwrap()
    }

    fn info(&self) -> HcaDevInfo {
        self.bar2.read_obj(BAR2_INFO_OFFSET)
    }

    /// A BAR0 doorbell write of `peer << 16 | class`, as QEMU turns it into an eventfd write.
    fn ring(&self, class: u32) {
        let (_, fds) = &self.view.peers[0];
        (&fds[class as usize])
            .write_all(&1u64.to_ne_bytes())
            .unwrap();
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

    fn cmd(&mut self, opcode: u32, input: &[u8], flags: u32) -> (u32, [u8; 64]) {
        self.seq += 1;
        let mut mb = HcaCmdMailbox {
            opcode,
            flags,
            ..Default::default()
        };
        mb.input[..input.len()].copy_from_slice(input);
        self.bar2.write_obj(BAR2_MAILBOX_OFFSET, &mb);
        self.bar2.store_u32(BAR2_MAILBOX_OFFSET + 8, self.seq);
        self.ring(DB_CMD);
        let deadline = Instant::now() + WAIT;
        loop {
            let done: HcaCmdMailbox = self.bar2.read_obj(BAR2_MAILBOX_OFFSET);
            if done.done_seq == self.seq {
                return (done.status, done.output);
            }
            assert!(
                Instant::now() < deadline,
                "command {opcode:#x} never completed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn handle(&mut self, opcode: u32, input: &[u8]) -> u32 {
        let (st, out) = self.cmd(opcode, input, 0);
        assert_eq!(st, CMD_OK, "command {opcode:#x}");
        u32::from_le_bytes(out[..4].try_into().unwrap())
    }

    fn modify(&mut self, qpn: u32, mask: u32, attr: HcaQpAttr) {
        let m = HcaCmdModifyQp {
            qpn,
            attr_mask: mask,
            attr,
        };
        assert_eq!(self.cmd(CMD_MODIFY_QP, m.as_slice(), 0).0, CMD_OK);
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
    }
    server.shutdown().unwrap();
    assert!(!cfgs[0].socket.exists(), "shutdown removes the sockets");
}

#[test]
fn test_doorbell_reaches_the_model_and_its_interrupt_comes_back() {
    let dir = scratch("irq");
    let cfgs = configs(&dir.0, 1);
    let _server = DeviceServer::start(cfgs.clone()).unwrap();
    let mut g = FakeGuest::connect(&cfgs[0]);
    assert!(g.wait_irq(VEC_ASYNC), "port-active event raised vector 0");
    let (st, out) = g.cmd(CMD_ALLOC_PD, &[], CMD_FLAG_EVENT);
    assert_eq!((st, out[0]), (CMD_OK, 1));
    assert!(g.wait_irq(VEC_ASYNC), "command completion raised vector 0");
}

#[test]
fn test_guest_ram_is_mapped_once_qemu_has_created_it() {
    let dir = scratch("ram");
    let cfgs = configs(&dir.0, 1);
    let _server = DeviceServer::start(cfgs.clone()).unwrap();
    let mut g = FakeGuest::connect(&cfgs[0]);
    let cq = HcaCmdCreateCq {
        ring_addr: 0x10_0000,
        log_entries: 4,
        vector: 1,
    };
    assert_eq!(
        g.cmd(CMD_CREATE_CQ, cq.as_slice(), 0).0,
        CMD_BAD_ADDRESS,
        "no RAM file yet"
    );
    let ram = g.create_ram();
    ram.write_slice(&[0xee; 512], GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(g.cmd(CMD_CREATE_CQ, cq.as_slice(), 0).0, CMD_OK);
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
    assert_eq!(
        g.cmd(CMD_CREATE_CQ, beyond.as_slice(), 0).0,
        CMD_BAD_ADDRESS
    );
}

/// Sets up PD, physical MR, CQ and an RC QP to `(dlid, dqpn)`; returns (key, cq ring, qpn, sq).
fn rc_endpoint(g: &mut FakeGuest, dlid: u16, dqpn: u32) -> (u32, u64, u32, u64) {
    let pd = g.handle(CMD_ALLOC_PD, &[]);
    let mr = HcaCmdRegMr {
        length: u64::MAX,
        pdn: pd,
        access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
        flags: MR_FLAG_PHYS,
        ..Default::default()
    };
    let key = g.handle(CMD_REG_MR, mr.as_slice());
    let cq_ring = 0x1_0000;
    let cq = HcaCmdCreateCq {
        ring_addr: cq_ring,
        log_entries: 4,
        vector: 1,
    };
    let cqn = g.handle(CMD_CREATE_CQ, cq.as_slice());
    let sq = 0x2_0000;
    let qp = HcaCmdCreateQp {
        sq_addr: sq,
        rq_addr: 0x3_0000,
        pdn: pd,
        send_cqn: cqn,
        recv_cqn: cqn,
        qp_type: QPT_RC,
        sq_log_entries: 4,
        sq_wqe_shift: 7,
        rq_log_entries: 4,
        rq_wqe_shift: 5,
        ..Default::default()
    };
    let qpn = g.handle(CMD_CREATE_QP, qp.as_slice());
    if dqpn != 0 {
        connect_rc(g, qpn, dlid, dqpn);
    }
    (key, cq_ring, qpn, sq)
}

fn connect_rc(g: &mut FakeGuest, qpn: u32, dlid: u16, dqpn: u32) {
    let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
    let a = |state: u32| HcaQpAttr {
        state: state as u8,
        port_num: 1,
        access_flags: access,
        dlid,
        dest_qpn: dqpn,
        path_mtu: MTU_4096 as u8,
        ..Default::default()
    };
    g.modify(
        qpn,
        QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
        a(QPS_INIT),
    );
    g.modify(
        qpn,
        QP_ATTR_STATE
            | QP_ATTR_AV
            | QP_ATTR_PATH_MTU
            | QP_ATTR_DEST_QPN
            | QP_ATTR_RQ_PSN
            | QP_ATTR_MAX_DEST_RD_ATOMIC
            | QP_ATTR_MIN_RNR_TIMER,
        a(QPS_RTR),
    );
    g.modify(
        qpn,
        QP_ATTR_STATE
            | QP_ATTR_SQ_PSN
            | QP_ATTR_TIMEOUT
            | QP_ATTR_RETRY_CNT
            | QP_ATTR_RNR_RETRY
            | QP_ATTR_MAX_QP_RD_ATOMIC,
        a(QPS_RTS),
    );
}

/// Posts an RDMA WRITE of `len` bytes and waits for its CQE; returns the CQE.
fn rdma_write(
    g: &FakeGuest,
    ram: &GuestMemoryMmap,
    (key, cq_ring, qpn, sq): (u32, u64, u32, u64),
    (src, dst, rkey, len): (u64, u64, u32, u32),
    index: u32,
) -> HcaCqe {
    let wqe = HcaSendWqe {
        wr_id: 77,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        num_sge: 1,
        remote_addr: dst,
        rkey,
        ..Default::default()
    };
    let slot = sq + (u64::from(index) << 7);
    ram.write_obj(wqe, GuestAddress(slot)).unwrap();
    let sge = HcaSge {
        addr: src,
        length: len,
        lkey: key,
    };
    ram.write_obj(sge, GuestAddress(slot + 64)).unwrap();
    g.bar2.store_u32(BAR2_QP_DB_OFFSET + qpn * 8, index + 1);
    g.ring(DB_SQ);
    let cqe_at = GuestAddress(cq_ring + u64::from(index) * 32);
    let deadline = Instant::now() + WAIT;
    loop {
        let c: HcaCqe = ram.read_obj(cqe_at).unwrap();
        if c.owner == owner_bit(index, 4) {
            return c;
        }
        assert!(Instant::now() < deadline, "no CQE for the RDMA WRITE");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A server with two guests whose RC QPs are connected to each other.
struct TwoGuests {
    server: DeviceServer,
    a: FakeGuest,
    b: FakeGuest,
    ram_a: GuestMemoryMmap,
    ram_b: GuestMemoryMmap,
    /// (key, CQ ring, QPN, SQ) of each side.
    ea: (u32, u64, u32, u64),
    eb: (u32, u64, u32, u64),
    dir: Scratch,
}

fn two_connected_guests(name: &str) -> TwoGuests {
    let dir = scratch(name);
    let cfgs = configs(&dir.0, 2);
    let server = DeviceServer::start(cfgs.clone()).unwrap();
    let mut a = FakeGuest::connect(&cfgs[0]);
    let mut b = FakeGuest::connect(&cfgs[1]);
    let (ram_a, ram_b) = (a.create_ram(), b.create_ram());
    let ea = rc_endpoint(&mut a, 0, 0);
    let eb = rc_endpoint(&mut b, 1, ea.2);
    connect_rc(&mut a, ea.2, 2, eb.2);
    TwoGuests {
        server,
        a,
        b,
        ram_a,
        ram_b,
        ea,
        eb,
        dir,
    }
}

#[test]
fn test_rdma_write_goes_from_one_guest_ram_file_into_another() {
    let g = two_connected_guests("rdma");
    let (a, ram_a, ram_b, ea, eb) = (&g.a, &g.ram_a, &g.ram_b, g.ea, g.eb);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    ram_a.write_slice(&data, GuestAddress(0x10_0000)).unwrap();
    let c = rdma_write(
        a,
        ram_a,
        ea,
        (0x10_0000, 0x40_0000, eb.0, data.len() as u32),
        0,
    );
    assert_eq!((u32::from(c.status), c.wr_id), (WC_SUCCESS, 77));
    let mut got = vec![0u8; data.len()];
    ram_b.read_slice(&mut got, GuestAddress(0x40_0000)).unwrap();
    assert_eq!(got, data);
}

#[test]
fn test_a_dead_guest_takes_only_its_own_hca_down() {
    let mut g = two_connected_guests("kill");
    let cfgs = configs(&g.dir.0, 2);

    drop(g.b); // node2's QEMU dies
    let deadline = Instant::now() + WAIT;
    while g.server.hca(1).is_some() {
        assert!(
            Instant::now() < deadline,
            "the server never noticed the guest left"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // node1 sees an error completion for its connection to the dead node, and goes on.
    let c = rdma_write(&g.a, &g.ram_a, g.ea, (0x10_0000, 0x40_0000, g.eb.0, 64), 0);
    assert_eq!(u32::from(c.status), WC_RETRY_EXC_ERR);
    assert_eq!(
        g.a.cmd(CMD_QUERY_PORT, &[], 0).0,
        CMD_OK,
        "node1 still served"
    );

    // node2 boots again: a fresh device at its old LID.
    let b2 = FakeGuest::connect(&cfgs[1]);
    let info = b2.info();
    assert_eq!((info.lid, u32::from(info.port_state)), (2, PORT_ACTIVE));
    assert_eq!(g.server.fabric().stats().no_route, 1);
}
