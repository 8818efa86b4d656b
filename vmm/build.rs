//! Builds the bare-metal test guest (vmm/guest: a freestanding x86-64 program, no Linux)
//! into a flat binary the VMM's tests load at 1 MiB. Without gcc/objcopy the blob is empty
//! and the tests that need it say so and skip.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let bin = out.join("hcatest.bin");
    let elf = out.join("hcatest.elf");
    for f in [
        "guest/entry.S",
        "guest/hcatest.c",
        "guest/rdma.c",
        "guest/hcatest.h",
        "guest/guest.ld",
        "guest/shim/linux/types.h",
        "../guest-kmod/include/hca_abi.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    let gcc = Command::new("gcc")
        .args([
            "-ffreestanding",
            "-nostdlib",
            "-fno-pic",
            "-no-pie",
            "-mno-red-zone",
            "-mgeneral-regs-only",
            "-O2",
            "-Wall",
            "-Iguest/shim",
            "-static",
            "-Tguest/guest.ld",
            "-Wl,--build-id=none,--no-warn-rwx-segments",
            "-o",
        ])
        .arg(&elf)
        .args(["guest/entry.S", "guest/hcatest.c", "guest/rdma.c"])
        .status();
    let ok = matches!(gcc, Ok(s) if s.success())
        && matches!(
            Command::new("objcopy").args(["-O", "binary"]).arg(&elf).arg(&bin).status(),
            Ok(s) if s.success()
        );
    if !ok {
        println!("cargo:warning=bare-metal test guest not built (gcc/objcopy missing or failed)");
        std::fs::write(&bin, []).unwrap();
    }
}
