#!/usr/bin/env python3
"""Builds hcabench guest images from Debian's own packages.

Resolves the kernel `linux-image-amd64` points to, downloads it and busybox-static (never
installing them into the host), extracts the ELF vmlinux from the bzImage (it boots through
PVH, faster than the bzImage under TCG) and keeps the bzImage (the KVM backend boots it), builds the guest modules in guest-kmod/ against the
matching `linux-headers-<ver>-amd64` (installed if missing), and packs an initramfs with
busybox, the init script, the kernel modules hcabench needs and ours.

Output (default target/images/): <ver>/vmlinux, <ver>/bzImage, <ver>/initramfs.cpio.gz, <ver>/manifest.json
and `current` (the version). Everything is cached: a rebuild happens only when an input (a
package, the init script, a module source, this script) changes.

Usage: images/build.py [--out DIR] [--quiet]
"""

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KMOD = ROOT / "guest-kmod"
# Kernel modules from Debian's package that guests load at boot (with their dependencies).
KERNEL_MODULES = ["ib_core", "rdma_cm", "ib_umad", "rdma_ucm"]
# Loaded on demand by `rxe-up` (SoftRoCE over virtio-net, the verbs benchmark's peer).
RXE_MODULES = ["virtio_pci", "virtio_net", "crc32_generic", "rdma_rxe"]
# IPoIB over hcab0 (`ipoib-up`): Debian's ib_ipoib and what it needs.
IPOIB_MODULES = ["ib_ipoib"]
# NVMe over Fabrics on RDMA (`nvmeof`): Debian's target and host, and brd for a RAM disk
# to export.
NVME_MODULES = ["nvmet_rdma", "nvme_rdma", "brd"]
# Reliable Datagram Sockets over IB (rds and its RDMA transport), loaded by `rds-up`.
RDS_MODULES = ["rds_rdma"]
# SCSI RDMA Protocol (`srp`): Debian's LIO target with its SRP fabric (ib_srpt), the
# initiator (ib_srp) and the disk driver its LUNs appear through; brd as above.
SRP_MODULES = ["ib_srpt", "target_core_iblock", "ib_srp", "sd_mod", "brd"]
# NFS over RDMA (`nfs`): Debian's server (nfsd; svcrdma is in rpcrdma) and NFSv4 client
# (xprtrdma, in rpcrdma too).
NFS_MODULES = ["nfsd", "rpcrdma", "nfsv4"]
# iSCSI Extensions for RDMA (`iser`): Debian's LIO iSCSI target with its iSER transport
# (ib_isert), the initiator's iSER transport (ib_iser, under open-iscsi's iscsid), the disk
# driver its LUNs appear through, brd as above, CRC32C, which LIO's login sets up for
# iSCSI digests whether or not they are negotiated, and iscsi_tcp, whose transport
# iscsiadm needs to run SendTargets discovery over TCP (see images/iser).
ISER_MODULES = ["ib_isert", "target_core_iblock", "ib_iser", "sd_mod", "crc32c_generic",
                "brd", "iscsi_tcp"]
# The order files modload reads (NAME-order: a list's modules with their dependencies,
# dependencies first), and the manifest key each is listed under.
ORDERS = [("load", KERNEL_MODULES, "kernel_modules"), ("rxe", RXE_MODULES, "rxe_modules"),
          ("ipoib", IPOIB_MODULES, "ipoib_modules"), ("nvme", NVME_MODULES, "nvme_modules"),
          ("rds", RDS_MODULES, "rds_modules"), ("srp", SRP_MODULES, "srp_modules"),
          ("nfs", NFS_MODULES, "nfs_modules"), ("iser", ISER_MODULES, "iser_modules")]
# Our modules: directories under guest-kmod/ with a Kbuild file.
OUR_MODULES = ["probe", "hca_ib", "vbench", "dsm"]
# Shell helpers from images/ that go to the guest's /bin.
SCRIPTS = ["vb", "dsmctl", "rxe-up", "ipoib-up", "nvmeof", "rds-up", "srp", "nfs", "iser",
           "lio-disk", "ib0-addr", "modload"]
# Guest user-space tools (static binaries) built from guest-kmod/user/*.c.
USER_TOOLS = ["vbench-user", "dsm-prot", "rds-echo", "pma-query"]
# DSM applications (guest-kmod/apps/*.c), linked with the static user library libdsm.a.
DSM_APPS = ["sor", "is", "lu", "tsp", "nbody", "nbodyw", "water", "barnes", "litmus", "dsm-bench"]
# Debian's user-space tools the guests carry, from their packages, with the shared
# libraries they need: iproute2's `rdma` (to add rxe links and show `rdma link`), and
# infiniband-diags' `saquery` and `ibstat` (they reach the SA through ib_umad) and
# `smpquery`, `perfquery`, `sminfo`, `ibnetdiscover`, `iblinkinfo`, `ibroute`,
# `ibtracert` and `ibqueryerrors` (QP0's agents, the fabric's switch and the PMAs,
# through ib_umad) and `ibping` (a vendor class over QP1), and
# nfs-utils' NFS server tools (`nfs export`; rpc.mountd links libtirpc, which links
# Kerberos' GSS-API), and open-iscsi's initiator daemon and admin tool (`iser connect`).
USERLAND_TOOLS = ["rdma", "saquery", "ibstat", "smpquery", "perfquery", "sminfo",
                  "ibnetdiscover", "iblinkinfo", "ibroute", "ibtracert", "ibqueryerrors",
                  "ibping", "rpc.nfsd", "rpc.mountd", "exportfs", "iscsid", "iscsiadm"]
USERLAND_DEBS = ["iproute2", "libmnl0", "libbsd0", "libcap2", "libmd0", "libc6",
                 "infiniband-diags", "libibmad5", "libibumad3", "libibnetdisc5",
                 "nfs-kernel-server", "libtirpc3", "libwrap0", "libnsl2", "libblkid1",
                 "libuuid1", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3",
                 "libkrb5support0", "libcom-err2", "libkeyutils1",
                 "open-iscsi", "libisns0", "libssl3", "libmount1", "libkmod2",
                 "libopeniscsiusr", "libsystemd0", "libselinux1", "libpcre2-8-0",
                 "libgcrypt20", "libgpg-error0", "liblzma5", "libzstd1", "liblz4-1"]
USERLAND_LIBS = ["libmnl.so.0", "libbsd.so.0", "libcap.so.2", "libmd.so.0", "libc.so.6",
                 "ld-linux-x86-64.so.2", "libibmad.so.5", "libibumad.so.3",
                 "libibnetdisc.so.5", "libtirpc.so.3", "libwrap.so.0", "libnsl.so.2", "libblkid.so.1",
                 "libuuid.so.1", "libgssapi_krb5.so.2", "libkrb5.so.3", "libk5crypto.so.3",
                 "libkrb5support.so.0", "libcom_err.so.2", "libkeyutils.so.1",
                 "libresolv.so.2", "libisns.so.0", "libcrypto.so.3", "libmount.so.1",
                 "libkmod.so.2", "libopeniscsiusr.so.0.2.0", "libsystemd.so.0",
                 "libselinux.so.1", "libpcre2-8.so.0", "libgcrypt.so.20",
                 "libgpg-error.so.0", "liblzma.so.5", "libzstd.so.1", "liblz4.so.1"]

quiet = False


def say(msg):
    if not quiet:
        print(f"images: {msg}", flush=True)


def die(msg):
    print(f"images: error: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout
    except FileNotFoundError:
        die(f"`{cmd[0]}` not found; on Debian: apt-get install -y {hint(cmd[0])}")
    except subprocess.CalledProcessError as e:
        die(f"`{' '.join(cmd)}` failed:\n{e.stdout}{e.stderr}")


def hint(tool):
    return {"dpkg-deb": "dpkg", "apt-get": "apt", "apt-cache": "apt", "make": "make"}.get(tool, tool)


def kernel_version():
    """The ABI version linux-image-amd64 depends on, e.g. 6.1.0-56-amd64."""
    out = run(["apt-cache", "depends", "linux-image-amd64"])
    m = re.search(r"Depends: linux-image-(\S+-amd64)", out)
    if not m:
        die("apt-cache knows no linux-image-amd64; run `apt-get update` first")
    return m.group(1)


def download(pkg, cache):
    """Downloads a .deb into cache (once per version) and returns its path."""
    cache.mkdir(parents=True, exist_ok=True)
    ver = run(["apt-cache", "policy", pkg])
    m = re.search(r"Candidate: (\S+)", ver)
    if not m or m.group(1) == "(none)":
        die(f"no candidate for {pkg}; run `apt-get update`")
    # apt names files with the epoch's colon escaped.
    want = f"{pkg}_{m.group(1).replace(':', '%3a')}_"
    have = [p for p in cache.glob(f"{pkg}_*.deb") if p.name.startswith(want)]
    if have:
        return have[0]
    say(f"downloading {pkg} {m.group(1)}")
    run(["apt-get", "download", "-q", pkg], cwd=cache)
    have = [p for p in cache.glob(f"{pkg}_*.deb") if p.name.startswith(want)]
    if not have:
        die(f"apt-get download {pkg} produced no file")
    return have[0]


def extract(deb, into):
    if not (into / ".done").exists():
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        run(["dpkg-deb", "-x", str(deb), str(into)])
        (into / ".done").write_text(deb.name)
    return into


def vmlinux_from_bzimage(bz, out):
    """Finds the xz stream in the bzImage and decompresses it to the ELF kernel."""
    data = bz.read_bytes()
    off = data.find(b"\xfd7zXZ\x00")
    while off >= 0:
        try:
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[off:])
            if elf[:4] == b"\x7fELF":
                out.write_bytes(elf)
                return
        except lzma.LZMAError:
            pass
        off = data.find(b"\xfd7zXZ\x00", off + 1)
    die(f"no xz-compressed ELF kernel inside {bz}")


def module_closure(moddir, names):
    """The .ko files (relative to moddir) for `names` and all they depend on, in load order.

    The package carries no modules.dep (depmod writes it at install), so dependencies are
    read from each module's .modinfo "depends=" entry.
    """
    paths = {ko.stem.replace("-", "_"): ko for ko in (moddir / "kernel").rglob("*.ko")}
    order, seen = [], set()

    def visit(name):
        # .modinfo spells some names with '-' (nvme-core); files and /proc use '_'.
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        ko = paths.get(name)
        if ko is None:
            die(f"kernel module {name} is not in {moddir}")
        m = re.search(rb"\0depends=([^\0]*)\0", ko.read_bytes())
        for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
            visit(dep)
        order.append(str(ko.relative_to(moddir)))

    for n in names:
        visit(n)
    return order


def headers_dir(kver):
    d = Path(f"/usr/src/linux-headers-{kver}")
    if d.exists():
        return d
    pkg = f"linux-headers-{kver}"
    if os.geteuid() != 0:
        die(f"module builds need {pkg}: run `sudo apt-get install -y {pkg}`")
    say(f"installing {pkg} (for module builds)")
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return d


def build_our_modules(kver):
    hdr = headers_dir(kver)
    built = []
    for m in OUR_MODULES:
        src = KMOD / m
        say(f"building guest-kmod/{m} against {kver}")
        run(["make", "-s", "-C", str(hdr), f"M={src}", "modules"])
        built += sorted(src.glob("*.ko"))
    return built


def build_user_tools():
    """Static binaries: the guest has busybox and no libc of its own."""
    out = {}
    for t in USER_TOOLS:
        src = KMOD / "user" / f"{t}.c"
        exe = ROOT / "target" / "guest-tools" / t
        exe.parent.mkdir(parents=True, exist_ok=True)
        say(f"building guest-kmod/user/{t}")
        run(["gcc", "-static", "-O2", "-Wall", "-o", str(exe), str(src)])
        out[t] = exe.read_bytes()
    return out


def build_dsm_apps():
    """libdsm.a, then every DSM application linked statically against it."""
    outdir = ROOT / "target" / "guest-tools"
    outdir.mkdir(parents=True, exist_ok=True)
    obj, lib = outdir / "libdsm.o", outdir / "libdsm.a"
    say("building guest-kmod/libdsm (libdsm.a)")
    run(["gcc", "-O2", "-Wall", "-pthread", "-c", "-o", str(obj), str(KMOD / "libdsm" / "libdsm.c")])
    if lib.exists():
        lib.unlink()
    run(["ar", "rcs", str(lib), str(obj)])
    out = {}
    for a in DSM_APPS:
        exe = outdir / a
        say(f"building guest-kmod/apps/{a}")
        run(["gcc", "-static", "-O2", "-Wall", "-pthread", "-o", str(exe),
             str(KMOD / "apps" / f"{a}.c"), str(lib), "-lm"])
        out[a] = exe.read_bytes()
    return out


def userland(cache):
    """USERLAND_TOOLS and their shared libraries, from Debian's packages:
    {path in image: bytes}."""
    roots = [extract(download(p, cache), cache / f"root-{p}") for p in USERLAND_DEBS]
    files = {}
    for tool in USERLAND_TOOLS:
        for r in roots:
            for d in ["bin", "sbin", "usr/bin", "usr/sbin"]:
                if (r / d / tool).is_file():
                    files[f"bin/{tool}"] = (r / d / tool).read_bytes()
        if f"bin/{tool}" not in files:
            die(f"{tool} is in none of {', '.join(USERLAND_DEBS)}")
    for lib in USERLAND_LIBS:
        hits = [f for r in roots for f in r.rglob(lib) if f.resolve().is_file()]
        if not hits:
            die(f"{lib} is in none of {', '.join(USERLAND_DEBS)}")
        dest = "lib64" if lib.startswith("ld-linux") else "lib/x86_64-linux-gnu"
        files[f"{dest}/{lib}"] = hits[0].resolve().read_bytes()
    return files


class Cpio:
    """Writes a newc-format cpio archive (what the kernel unpacks as initramfs)."""

    def __init__(self):
        self.out = bytearray()
        self.ino = 1

    def _entry(self, name, mode, data=b"", nlink=1):
        name_b = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name_b), 0))
        self.ino += 1
        self.out += hdr.encode() + name_b
        self.out += b"\0" * (-len(self.out) % 4)
        self.out += data
        self.out += b"\0" * (-len(self.out) % 4)

    def dir(self, name):
        self._entry(name, stat.S_IFDIR | 0o755, nlink=2)

    def file(self, name, data, mode=0o644):
        self._entry(name, stat.S_IFREG | mode, data)

    def finish(self):
        self._entry("TRAILER!!!", 0)
        return bytes(self.out)


def digest(paths, extra):
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes() if p.is_file() else b"")
    h.update(extra.encode())
    return h.hexdigest()


def main():
    global quiet
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "target" / "images"), help="output directory")
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    args = ap.parse_args()
    quiet = args.quiet
    out = Path(args.out)
    started = time.monotonic()

    kver = kernel_version()
    cache = out / "cache"
    kdeb = download(f"linux-image-{kver}", cache)
    bdeb = download("busybox-static", cache)
    init = ROOT / "images" / "init.sh"
    sources = [kdeb, bdeb, init, Path(__file__).resolve()]
    sources += [ROOT / "images" / n for n in SCRIPTS]
    for m in OUR_MODULES:
        sources += sorted((KMOD / m).glob("*.[ch]")) + [KMOD / m / "Kbuild"]
    sources += sorted((KMOD / "include").glob("*.h"))
    sources += sorted((KMOD / "common").glob("*.[ch]"))
    sources += sorted((KMOD / "user").glob("*.c"))
    sources += sorted((KMOD / "libdsm").glob("*.[ch]")) + sorted((KMOD / "apps").glob("*.c"))
    key = digest(sources, kver)
    dest = out / kver
    manifest = dest / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("key") == key:
        say(f"{kver}: up to date ({dest})")
        (out / "current").write_text(kver + "\n")
        return

    kroot = extract(kdeb, cache / f"root-{kdeb.stem}")
    broot = extract(bdeb, cache / f"root-{bdeb.stem}")
    dest.mkdir(parents=True, exist_ok=True)
    say(f"{kver}: extracting vmlinux")
    vmlinux_from_bzimage(kroot / "boot" / f"vmlinuz-{kver}", dest / "vmlinux")
    shutil.copyfile(kroot / "boot" / f"vmlinuz-{kver}", dest / "bzImage")

    ours = build_our_modules(kver)
    tools = build_user_tools()
    tools.update(build_dsm_apps())
    debian_tools = userland(cache)
    moddir = kroot / "lib" / "modules" / kver
    img = Cpio()
    for d in ["bin", "dev", "proc", "sys", "tmp", "lib", "lib64", "lib/x86_64-linux-gnu",
              "lib/modules", f"lib/modules/{kver}", f"lib/modules/{kver}/kernel",
              f"lib/modules/{kver}/extra"]:
        img.dir(d)
    img.file("bin/busybox", (broot / "bin" / "busybox").read_bytes(), 0o755)
    img.file("init", init.read_bytes(), 0o755)
    for script in SCRIPTS:
        img.file(f"bin/{script}", (ROOT / "images" / script).read_bytes(), 0o755)
    for name, data in tools.items():
        img.file(f"bin/{name}", data, 0o755)
    for path, data in debian_tools.items():
        img.file(path, data, 0o755)
    # Each order lists its whole closure (modload skips what is loaded); each module file
    # goes into the image once. brd takes its size as a parameter: its users load it.
    packed, orders = set(), {}
    for order_name, names, _ in ORDERS:
        order = []
        for rel in module_closure(moddir, names):
            name = f"kernel/{Path(rel).name}"
            if name not in packed:
                img.file(f"lib/modules/{kver}/{name}", (moddir / rel).read_bytes())
                packed.add(name)
            if name != "kernel/brd.ko":
                order.append(name)
        orders[order_name] = order
        img.file(f"lib/modules/{kver}/{order_name}-order", ("\n".join(order) + "\n").encode())
    for ko in ours:
        img.file(f"lib/modules/{kver}/extra/{ko.name}", ko.read_bytes())
    (dest / "initramfs.cpio.gz").write_bytes(gzip.compress(img.finish(), 6))
    manifest.write_text(json.dumps({
        "key": key, "kernel": kver, "kernel_deb": kdeb.name, "busybox_deb": bdeb.name,
        **{key: orders[order_name] for order_name, _, key in ORDERS},
        "our_modules": [k.name for k in ours], "tools": sorted(tools) + sorted(debian_tools),
    }, indent=2) + "\n")
    (out / "current").write_text(kver + "\n")
    say(f"{kver}: built in {time.monotonic() - started:.1f}s -> {dest}")


if __name__ == "__main__":
    main()
