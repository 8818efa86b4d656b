#!/usr/bin/env python3
"""Packs the initramfs of a nested KVM host ("L1") for ci/nested-kvm.sh.

L1 is a QEMU TCG guest with `-cpu max`, which gives it AMD SVM with nested paging: inside
it, Debian's kvm_amd makes /dev/kvm a real, hardware-style KVM on which hcabench's own VMM
(and QEMU with -accel kvm, the reference) can run Linux guests ("L2").

The initramfs is the guest image's own (busybox, libc, modules) followed by a second,
uncompressed archive that adds:
  /init                          images/nested-init.sh (loads KVM, runs /job.sh)
  /lib/modules/<ver>/kvm/*.ko    kvm_amd and its dependencies, with kvm-order
  /opt/hcabench/bin/hcabench     a static hcabench
  /opt/hcabench/target/images/   the L2 guest image (bzImage, vmlinux, initramfs, the
                                 shared userland disk)
  /usr/bin/qemu-system-x86_64    with --with-qemu: this host's QEMU, its libraries and the
                                 firmware it loads, for reference boots under QEMU/KVM
  /job.sh                        the commands to run in L1

L1 and L2 run the same Debian kernel: the default image's, or --kernel's (a built image's
name or Debian version, e.g. 6.12), which becomes L1's default image.

Usage: images/nested.py --hcabench BIN --job FILE --out FILE [--with-qemu] [--kernel K]
Prints the name of the image it used (the directory under target/images).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build  # noqa: E402  (the guest image builder's cpio writer and module resolver)

KVM_MODULES = ["kvm_amd"]
# What QEMU reads from its data directory for a direct Linux boot with no display.
QEMU_FIRMWARE = ["bios-256k.bin", "kvmvapic.bin", "linuxboot_dma.bin", "pvh.bin",
                 "multiboot_dma.bin"]
QEMU = "/usr/bin/qemu-system-x86_64"
QEMU_DATA_DIRS = [Path("/usr/share/qemu"), Path("/usr/share/seabios")]


def shared_libraries(exe):
    """The absolute paths of the libraries `exe` loads, the dynamic loader included."""
    out = subprocess.run(["ldd", exe], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(Path(parts[2]))
        elif parts and parts[0].startswith("/"):
            libs.append(Path(parts[0]))
    return libs


def add_tree_dirs(img, seen, path):
    """Adds every parent directory of `path` once."""
    parts = Path(path).parts[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            img.dir(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hcabench", required=True, help="a statically linked hcabench")
    ap.add_argument("--job", required=True, help="shell script L1 runs after loading KVM")
    ap.add_argument("--out", required=True, help="the initramfs to write")
    ap.add_argument("--images", default=str(build.ROOT / "target" / "images"),
                    help="where images/build.py put the guest image")
    ap.add_argument("--with-qemu", action="store_true",
                    help="carry this host's qemu-system-x86_64 for reference boots")
    ap.add_argument("--kernel", help="the image's name or Debian version (default: the "
                    "default image)")
    args = ap.parse_args()

    images = Path(args.images)
    name = image_name(images, args.kernel)
    guest = images / name
    manifest = json.loads((guest / "manifest.json").read_text())
    kver, kdeb = manifest.get("kernel", name), manifest.get("kernel_deb")
    if not kdeb:
        build.die(f"image {name} is a developer's kernel: the nested host boots Debian's "
                  f"(it loads kvm_amd from the package)")
    kroot = images / "cache" / f"root-{Path(kdeb).stem}"
    moddir = kroot / "lib" / "modules" / kver
    if not moddir.is_dir():
        build.die(f"{moddir} is missing: run python3 images/build.py first")

    img = build.Cpio()
    seen = set()

    def file(path, data, mode=0o644):
        add_tree_dirs(img, seen, path)
        img.file(path, data, mode)

    file("init", (build.ROOT / "images" / "nested-init.sh").read_bytes(), 0o755)
    file("job.sh", Path(args.job).read_bytes(), 0o755)
    order = []
    mods = build.Modules(moddir)
    for mod in mods.closure(KVM_MODULES):
        file(f"lib/modules/{kver}/kvm/{mods.file_name(mod)}", mods.read(mod))
        order.append(f"kvm/{mods.file_name(mod)}")
    file(f"lib/modules/{kver}/kvm-order", ("\n".join(order) + "\n").encode())
    file("opt/hcabench/bin/hcabench", Path(args.hcabench).read_bytes(), 0o755)
    file("opt/hcabench/target/images/current", f"{name}\n".encode())
    for f in ["bzImage", "vmlinux", "initramfs.cpio", "manifest.json"]:
        file(f"opt/hcabench/target/images/{name}/{f}", (guest / f).read_bytes())
    # The shared userland disk, which the L2 guests attach (virtio-mmio under the VMM).
    if (guest / "userland.img").exists():
        file(f"opt/hcabench/target/images/{name}/userland.img",
             (guest / "userland.img").read_bytes())
    if args.with_qemu:
        file("usr/bin/qemu-system-x86_64", Path(QEMU).read_bytes(), 0o755)
        for lib in shared_libraries(QEMU):
            dest = "lib64" if lib.name.startswith("ld-linux") else "lib/x86_64-linux-gnu"
            file(f"{dest}/{lib.name}", lib.resolve().read_bytes(), 0o755)
        for fw in QEMU_FIRMWARE:
            # QEMU looks in its own data directory, then in SeaBIOS's.
            src = [d / fw for d in QEMU_DATA_DIRS if (d / fw).exists()]
            if not src:
                build.die(f"QEMU's firmware {fw} is in none of "
                          f"{', '.join(map(str, QEMU_DATA_DIRS))} (apt-get install qemu-system-x86)")
            file(str(src[0])[1:], src[0].resolve().read_bytes())

    # The kernel unpacks concatenated archives in turn; later files replace earlier ones.
    first = (guest / "initramfs.cpio").read_bytes()
    pad = b"\0" * (-len(first) % 512)
    # The second stays uncompressed: TCG unpacks it far faster than it would inflate it.
    Path(args.out).write_bytes(first + pad + img.finish())
    print(name)


def image_name(images, kernel):
    """The image directory --kernel names, as hcabench finds it (cluster/src/image.rs): the
    default one, one of that name, or the newest of that Debian version."""
    if kernel is None:
        return (images / "current").read_text().strip()
    if (images / kernel / "manifest.json").exists():
        return kernel
    found = sorted((d for d in images.iterdir() if (d / "manifest.json").exists()
                    and not d.name.startswith("local-") and d.name.startswith(kernel)
                    and d.name[len(kernel):][:1] in (".", "-")),
                   key=lambda d: (d / "manifest.json").stat().st_mtime)
    if not found:
        build.die(f"no image of kernel {kernel} in {images}: python3 images/build.py "
                  f"--kernel {kernel}")
    return found[-1].name


if __name__ == "__main__":
    main()
