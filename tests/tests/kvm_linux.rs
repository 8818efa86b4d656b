//! Linux under the KVM backend. Where KVM is real (hardware virtualisation), Debian's
//! bzImage boots through the launcher with the initramfs on 2 vCPUs, the guest's init loads
//! the HCA driver on the VMM's PCI device and reports the port ACTIVE. Where it is not (this project's build
//! machines: /dev/kvm emulates instruction by instruction), that test is skipped with the
//! reason, and an honest partial check runs instead: the uncompressed vmlinux (decompressing
//! the bzImage would take hours at that speed) must print its first boot lines on the VMM's
//! serial console and find the VMM's e820 map and MP table (2 CPUs, the I/O APIC).

use std::time::Duration;

use cluster::console_protocol::{ERROR, IB, READY};
use cluster::{Backend, Cluster, ClusterSpec};
use e2e::{image_only_or_skip, skipped};
use hca_model::Fabric;
use vmm::linux::LinuxBoot;
use vmm::machine::{Machine, MachineConfig};
use vmm::{check_kvm, KvmCheck};

fn linux_machine(kvm: &kvm_ioctls::Kvm, ram_mib: usize, boot: &LinuxBoot) -> Machine {
    let fabric = Fabric::new();
    let m = Machine::new(
        kvm,
        MachineConfig {
            name: "node1".into(),
            lid: 1,
            ram_bytes: ram_mib << 20,
            vcpus: 2,
            serial_log: None,
            console_socket: None,
            agent_socket: None,
            vfio: Vec::new(),
            disks: Vec::new(),
            nic: None,
        },
        &fabric,
    )
    .unwrap();
    m.load_linux(boot).unwrap();
    m
}

#[test]
fn test_linux_boots_under_kvm_and_finds_the_hca() {
    let Some(image) = image_only_or_skip("linux under KVM") else {
        return;
    };
    if let KvmCheck::Unusable(why) = check_kvm() {
        skipped(
            "full Linux boot under KVM",
            &format!("{why} (the partial test runs instead)"),
        );
        return;
    }
    // Through the launcher, as `hcabench up --backend kvm` boots it: 2 vCPUs, 512 MiB.
    let spec = ClusterSpec {
        ram_mib: 512,
        vcpus: 2,
        console_sockets: false,
        job: "poweroff".into(),
        ..ClusterSpec::new(Backend::Kvm, image, e2e::scratch_dir("kvm-linux"), 1)
    };
    let mut c = Cluster::boot(&spec, &mut |m| eprintln!("{m}")).unwrap();
    let (_, at) = c
        .node_mut(0)
        .wait_line(READY, Duration::from_secs(120))
        .unwrap();
    let serial = c.node(0).console();
    eprintln!("{serial}");
    assert!(
        serial.contains(&format!("{IB} hcab0 lid=0x1 state=ACTIVE")),
        "{serial}"
    );
    assert!(!serial.contains(ERROR), "{serial}");
    eprintln!("Linux booted to READY under KVM in {at:.1?}");
    drop(c);
    let _ = std::fs::remove_dir_all(&spec.dir);
}

#[test]
fn test_linux_first_boot_lines_reach_the_serial_console() {
    let Some(image) = image_only_or_skip("linux first boot lines") else {
        return;
    };
    let kvm = match kvm_ioctls::Kvm::new() {
        Ok(k) => k,
        Err(e) => {
            skipped("linux first boot lines", &format!("no /dev/kvm ({e})"));
            return;
        }
    };
    let cmdline = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 hcabench.node=node1";
    let boot = LinuxBoot {
        kernel: image.vmlinux.clone(),
        initramfs: Some(image.initramfs.clone()),
        cmdline: cmdline.into(),
    };
    let mut m = linux_machine(&kvm, 256, &boot);
    m.start().unwrap();
    let enough = |s: &str| s.contains("Processors: 2");
    // On emulated KVM the guest may die of an emulation failure later in boot; the
    // lines checked here come before that.
    let serial = match m.wait(Duration::from_secs(240), enough) {
        Ok(out) => {
            eprintln!("stopped after {:.1?}", out.elapsed);
            out.serial
        }
        Err(e) => {
            let e = e.to_string();
            eprintln!(
                "the guest stopped on its own: {}",
                e.lines().next().unwrap()
            );
            e
        }
    };
    eprintln!("{serial}");
    let expect = [
        format!("Linux version {} ", image.kernel_version),
        format!("Command line: {cmdline}"),
        "BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable".into(),
        "BIOS-e820: [mem 0x000000000009fc00-0x00000000000fffff] reserved".into(),
        "BIOS-e820: [mem 0x0000000000100000-0x000000000fffffff] usable".into(),
        "found SMP MP-table at [mem 0x0009fc00-0x0009fc0f]".into(),
        "Processor #1".into(),
        "IOAPIC[0]: apic_id 2, version 17, address 0xfec00000".into(),
        "Processors: 2".into(),
    ];
    for line in &expect {
        assert!(
            serial.contains(line.as_str()),
            "missing {line:?} in:\n{serial}"
        );
    }
}
