//! The KVM backend on this host's /dev/kvm, with the bare-metal test guest (no Linux): it
//! enumerates PCI, finds the HCA, reads BAR2's signature, rings the command doorbell (an
//! ioeventfd) and takes the MSI-X interrupt (an irqfd through a GSI route); two such VMs in
//! one process exchange an RDMA Write through the in-process fabric. Skips, saying why,
//! where there is no /dev/kvm or the guest could not be built.

use std::time::{Duration, Instant};

use hca_model::Fabric;
use vmm::machine::{Machine, MachineConfig};
use vmm::test_guest::{mirror, set_role, Role};
use vmm::{check_kvm, TEST_GUEST, TEST_GUEST_ENTRY, TEST_GUEST_STACK};

/// Prints "SKIPPED test: why" straight to stderr, where a passing test's skip is seen.
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

fn kvm_or_skip(test: &str) -> Option<kvm_ioctls::Kvm> {
    if TEST_GUEST.is_empty() {
        skipped(
            test,
            "the bare-metal test guest was not built (no gcc at build time)",
        );
        return None;
    }
    match kvm_ioctls::Kvm::new() {
        Ok(k) => Some(k),
        Err(e) => {
            skipped(test, &format!("no usable /dev/kvm ({e})"));
            None
        }
    }
}

/// A 16 MiB VM on `fabric` at `lid` with the test guest loaded.
fn test_machine(kvm: &kvm_ioctls::Kvm, name: &str, lid: u16, fabric: &Fabric) -> Machine {
    test_machine_with_console(kvm, name, lid, fabric, None)
}

fn test_machine_with_console(
    kvm: &kvm_ioctls::Kvm,
    name: &str,
    lid: u16,
    fabric: &Fabric,
    console_socket: Option<std::path::PathBuf>,
) -> Machine {
    let m = Machine::new(
        kvm,
        MachineConfig {
            name: name.into(),
            lid,
            ram_bytes: 16 << 20,
            vcpus: 1,
            serial_log: None,
            console_socket,
            agent_socket: None,
            vfio: Vec::new(),
            disks: Vec::new(),
            nic: None,
        },
        fabric,
    )
    .unwrap();
    m.load_flat(TEST_GUEST, TEST_GUEST_ENTRY, TEST_GUEST_STACK)
        .unwrap();
    m
}

#[test]
fn test_kvm_check_answers_quickly() {
    let t = Instant::now();
    let verdict = check_kvm();
    eprintln!("check_kvm: {verdict:?} in {:.1?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5), "{verdict:?}");
}

#[test]
fn test_baremetal_guest_finds_the_hca_and_gets_its_msix_interrupt() {
    let Some(kvm) = kvm_or_skip("baremetal") else {
        return;
    };
    let fabric = Fabric::new();
    let mut m = test_machine(&kvm, "vm1", 1, &fabric);
    let out = m.run(Duration::from_secs(120)).unwrap();
    eprintln!("{}", out.serial);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.serial.contains("HCATEST PASS"), "{}", out.serial);
    assert!(
        out.serial.contains("bar2-signature 0x0000000042414348"),
        "{}",
        out.serial
    );
    assert!(m.hca().stats().interrupts >= 1, "{:?}", m.hca().stats());
    assert!(m.hca().stats().commands >= 1, "{:?}", m.hca().stats());
}

#[test]
fn test_a_triple_fault_is_reported_with_where_the_vcpu_stood() {
    let Some(kvm) = kvm_or_skip("triple fault") else {
        return;
    };
    let fabric = Fabric::new();
    let mut m = test_machine(&kvm, "vm1", 1, &fabric);
    // ud2 with no IDT: #UD cannot be delivered, nor the #GP or the #DF after it.
    m.load_flat(&[0x0f, 0x0b], TEST_GUEST_ENTRY, TEST_GUEST_STACK)
        .unwrap();
    let err = m.run(Duration::from_secs(60)).unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("the guest triple-faulted"), "{err}");
    // Intel keeps the faulting state; AMD's KVM resets the vCPU and the error says so.
    let at_ud2 = format!("rip={TEST_GUEST_ENTRY:#x}");
    assert!(
        err.contains(&at_ud2) || err.contains("reset by KVM"),
        "{err}"
    );
}

#[test]
fn test_two_vms_in_one_process_exchange_an_rdma_write() {
    let Some(kvm) = kvm_or_skip("two VMs") else {
        return;
    };
    let fabric = Fabric::new();
    let mut writer = test_machine(&kvm, "vm1", 1, &fabric);
    let mut target = test_machine(&kvm, "vm2", 2, &fabric);
    let (wmem, tmem) = (writer.memory(), target.memory());
    set_role(&wmem, Role::Writer).unwrap();
    set_role(&tmem, Role::Target).unwrap();
    let timeout = Duration::from_secs(120);
    let (w, t) = std::thread::scope(|s| {
        let w = s.spawn(|| writer.run(timeout));
        let t = s.spawn(|| target.run(timeout));
        // The host side of the out-of-band exchange, until both guests are done.
        while !(w.is_finished() && t.is_finished()) {
            mirror(&wmem, &tmem).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        (w.join().unwrap().unwrap(), t.join().unwrap().unwrap())
    });
    eprintln!("writer:\n{}\ntarget:\n{}", w.serial, t.serial);
    assert_eq!(w.exit_code, Some(0), "writer: {w:?}");
    assert_eq!(t.exit_code, Some(0), "target: {t:?}");
    assert!(
        w.serial
            .contains("rdma-write-cqe-status 0x0000000000000000"),
        "{}",
        w.serial
    );
    assert!(
        t.serial
            .contains("rdma-write-received-bytes 0x0000000000002000"),
        "{}",
        t.serial
    );
    // The data crossed the in-process fabric: the target's HCA received it as packets.
    let (ws, ts) = (writer.hca().stats(), target.hca().stats());
    eprintln!("writer HCA: {ws:?}\ntarget HCA: {ts:?}");
    assert!(ws.bytes_out >= 8192 && ts.packets_in >= 1, "{ws:?} {ts:?}");
}

#[test]
fn test_console_socket_shows_output_and_types_into_the_serial_port() {
    use std::io::{Read, Write};
    let Some(kvm) = kvm_or_skip("console socket") else {
        return;
    };
    let sock = std::env::temp_dir().join(format!("hcab-console-{}.sock", std::process::id()));
    let fabric = Fabric::new();
    let mut m = test_machine_with_console(&kvm, "vm1", 1, &fabric, Some(sock.clone()));
    set_role(&m.memory(), Role::Echo).unwrap();
    // Attached before the guest starts: the client sees everything it prints.
    let mut client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let t = Instant::now();
    while !m.console_attached() {
        assert!(t.elapsed() < Duration::from_secs(10), "never attached");
        std::thread::sleep(Duration::from_millis(5));
    }
    m.start().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("type a line") {
        let n = client.read(&mut buf).unwrap();
        assert!(n > 0, "console closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // Longer than the 64-byte receive FIFO: the console paces it, nothing is lost.
    let line = "hello from the console socket, ".repeat(3);
    client.write_all(format!("{line}\n").as_bytes()).unwrap();
    let out = m
        .wait(Duration::from_secs(60), |s| s.contains("HCATEST PASS"))
        .unwrap();
    let _ = std::fs::remove_file(&sock);
    assert!(
        out.serial.contains(&format!("HCATEST echo {line}\n")),
        "{}",
        out.serial
    );
    assert!(String::from_utf8_lossy(&seen).contains("HCATEST bar2-signature"));
}

/// Passthrough cannot run here (no IOMMU, no /dev/vfio, no spare adapter), but asking for
/// it must fail at once with the reason: the build lacks VFIO, or the function cannot be
/// opened through VFIO, naming it and what to check.
#[test]
fn test_passthrough_that_cannot_work_is_refused_with_the_reason() {
    let Some(kvm) = kvm_or_skip("test_passthrough_that_cannot_work_is_refused_with_the_reason")
    else {
        return;
    };
    let path = std::path::PathBuf::from("/sys/bus/pci/devices/0000:00:00.0");
    let err = Machine::new(
        &kvm,
        MachineConfig {
            name: "vfio".into(),
            lid: 1,
            ram_bytes: 16 << 20,
            vcpus: 1,
            serial_log: None,
            console_socket: None,
            agent_socket: None,
            vfio: vec![path.clone()],
            disks: Vec::new(),
            nic: None,
        },
        &Fabric::new(),
    )
    .err()
    .expect("passthrough of the host bridge without VFIO must fail")
    .to_string();
    println!("refused: {err}");
    assert!(err.contains("0000:00:00.0"), "{err}");
    if cfg!(feature = "vfio") {
        assert!(
            err.starts_with("VFIO /sys/bus/pci/devices/0000:00:00.0:"),
            "{err}"
        );
    } else {
        assert!(err.contains("--features vfio"), "{err}");
    }
}
