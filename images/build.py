#!/usr/bin/env python3
"""Builds hcabench guest images from Debian's own packages, or from a developer's kernel.

The kernel is Debian's by default: the one `linux-image-amd64` points to (6.1 on Debian 12).
`--kernel` picks another: a Debian kernel by version (`6.12`: the newest 6.12 Debian 12
carries, through `linux-image-6.12-amd64`), by flavour (`6.12-cloud-amd64`) or by exact
ABI name (`6.12.117+deb12-amd64`); or a developer's own kernel by path: a built tree
(`make` done: arch/x86/boot/bzImage, the modules in place) or a directory holding a bzImage
or vmlinux and its modules (`make modules_install INSTALL_MOD_PATH=DIR`, which leaves
DIR/lib/modules/<release>/build pointing at the tree). Debian's packages are downloaded,
never installed into the host (only the matching `linux-headers-<ver>` is, for module
builds).

The builder extracts the ELF vmlinux from the bzImage (it boots through PVH, faster than the
bzImage under TCG) and keeps the bzImage (the KVM backend boots it), builds the guest modules
in guest-kmod/ against the kernel's headers (in a copy per kernel, after compat/conftest.sh
has found which kernel interfaces they have), and packs an initramfs with busybox, the init
script, the kernel modules hcabench needs (from the same kernel: a developer's ib_core and
ib_ipoib are the ones that load) and ours (without their debugging sections), with the
modules.dep and other indexes the host's depmod makes for them (busybox's modprobe reads
them). User space: Debian's tools the guests carry with their shared libraries, among them
rdma-core's userland (libibverbs with every provider, librdmacm, ibverbs-utils,
rdmacm-utils, perftest), and our libibverbs provider for hcab0, which
guest-user/libhcab/build.sh builds (the image goes without it, saying so, while that script
is not there). A developer's kernel config is checked first for what the guests need, and
what is missing is said plainly.

Output (default target/images/): <name>/vmlinux, <name>/bzImage, <name>/initramfs.cpio,
<name>/manifest.json, where <name> is the kernel release (`uname -r` in the guest) for a
Debian kernel and `local-<release>` for a developer's; `current` names the default image (the
one a build without --kernel makes), which hcabench boots when no kernel is asked for.
Everything is cached: a rebuild happens only when an input (a package or the developer's
kernel files, the init script, a module source, guest-user/'s sources, this script)
changes.

Usage: images/build.py [--kernel VERSION|PATH] [--out DIR] [--print-dir] [--quiet]
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
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KMOD = ROOT / "guest-kmod"
# Kernel modules from Debian's package that guests load at boot (with their dependencies).
# ib_uverbs and rdma_ucm give user space its verbs (/dev/infiniband/uverbsN, rdma_cm).
KERNEL_MODULES = ["ib_core", "rdma_cm", "ib_umad", "ib_uverbs", "rdma_ucm"]
# Loaded on demand by `rxe-up` (SoftRoCE over virtio-net, the verbs benchmark's peer).
RXE_MODULES = ["virtio_pci", "virtio_net", "crc32_generic", "rdma_rxe"]
# IPoIB over hcab0 (`ipoib-up`): Debian's ib_ipoib and what it needs.
IPOIB_MODULES = ["ib_ipoib"]
# NVMe over Fabrics on RDMA (`nvmeof`): Debian's target and host, and brd for a RAM disk
# to export.
NVME_MODULES = ["nvmet_rdma", "nvme_rdma", "brd"]
# Reliable Datagram Sockets over IB (rds and its RDMA transport), loaded by `rds-up`.
RDS_MODULES = ["rds_rdma"]
# TIPC (`tipc-up`): Debian builds its InfiniBand media into tipc itself
# (CONFIG_TIPC_MEDIA_IB=y), which runs over ib0 (IPoIB carries ETH_P_TIPC).
TIPC_MODULES = ["tipc"]
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
# The shared userland disk (`userland-up`): virtio-blk, EROFS (read-only by design; its
# module is a tenth of ext4's with jbd2 and mbcache, which a TCG guest loads in 0.2 s less)
# and overlayfs, which lays the disk's /usr under the initramfs's.
DISK_MODULES = ["virtio_pci", "virtio_blk", "erofs", "overlay"]
# The same disk under hcabench's VMM, whose virtio devices are on virtio-mmio (announced on
# the kernel command line as virtio_mmio.device=, which modload passes to the module; where
# the kernel lacks CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES, as Debian's does, our vmmio module
# registers the devices instead: see userland-up).
VIRTIO_MMIO_MODULES = ["virtio_mmio"]
ORDERS = [("load", KERNEL_MODULES, "kernel_modules"), ("rxe", RXE_MODULES, "rxe_modules"),
          ("ipoib", IPOIB_MODULES, "ipoib_modules"), ("nvme", NVME_MODULES, "nvme_modules"),
          ("rds", RDS_MODULES, "rds_modules"), ("tipc", TIPC_MODULES, "tipc_modules"),
          ("srp", SRP_MODULES, "srp_modules"),
          ("nfs", NFS_MODULES, "nfs_modules"), ("iser", ISER_MODULES, "iser_modules"),
          ("disk", DISK_MODULES, "disk_modules"),
          ("virtio-mmio", VIRTIO_MMIO_MODULES, "virtio_mmio_modules")]
# Our modules: directories under guest-kmod/ with a Kbuild file.
OUR_MODULES = ["probe", "hca_ib", "vbench", "dsm", "vmmio"]
# Shell helpers from images/ that go to the guest's /bin.
SCRIPTS = ["vb", "dsmctl", "rxe-up", "ipoib-up", "nvmeof", "rds-up", "tipc-up", "srp", "nfs",
           "iser", "lio-disk", "ib0-addr", "modload", "userland-up", "vmmio-up"]
# Guest user-space tools (static binaries) built from guest-kmod/user/*.c.
USER_TOOLS = ["vbench-user", "dsm-prot", "rds-echo", "tipc-echo", "pma-query"]
# DSM applications (guest-kmod/apps/*.c), linked with the static user library libdsm.a.
DSM_APPS = ["sor", "is", "lu", "tsp", "nbody", "nbodyw", "water", "barnes", "litmus", "dsm-bench"]
# Debian's user-space tools the guests carry, from their packages, with the shared
# libraries they need: iproute2's `rdma` (to add rxe links and show `rdma link`) and `tipc`
# (TIPC's bearers, links and name table: `tipc-up`), and
# infiniband-diags' `saquery` and `ibstat` (they reach the SA through ib_umad) and
# `smpquery`, `perfquery`, `sminfo`, `ibnetdiscover`, `iblinkinfo`, `ibroute`,
# `ibtracert` and `ibqueryerrors` (QP0's agents, the fabric's switch and the PMAs,
# through ib_umad) and `ibping` (a vendor class over QP1), and
# nfs-utils' NFS server tools (`nfs export`; rpc.mountd links libtirpc, which links
# Kerberos' GSS-API), and open-iscsi's initiator daemon and admin tool (`iser connect`).
USERLAND_TOOLS = ["rdma", "tipc", "saquery", "ibstat", "smpquery", "perfquery", "sminfo",
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

# User-level verbs: Debian 12's rdma-core 44 (libibverbs with every provider of
# ibverbs-providers, found through /etc/libibverbs.d/NAME.driver in
# /usr/lib/x86_64-linux-gnu/libibverbs/), librdmacm, ibverbs-utils' ibv_* tools,
# rdmacm-utils' (rping, udaddy, mckey, ...) and perftest's InfiniBand benchmarks (which link
# libmlx5, libefa and libpci); glibc loads libgcc_s when a thread exits (rping's do).
VERBS_TOOLS = ["ibv_devinfo", "ibv_devices", "ibv_asyncwatch", "ibv_rc_pingpong",
               "ibv_uc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong", "ibv_xsrq_pingpong",
               "rping", "udaddy", "mckey", "ucmatose", "rdma_client", "rdma_server",
               "rdma_xclient", "rdma_xserver", "rstream", "riostream", "rcopy", "cmtime",
               "udpong", "ib_send_lat", "ib_send_bw", "ib_write_lat", "ib_write_bw",
               "ib_read_lat", "ib_read_bw", "ib_atomic_lat", "ib_atomic_bw"]
VERBS_DEBS = ["libibverbs1", "ibverbs-providers", "ibverbs-utils", "librdmacm1",
              "rdmacm-utils", "perftest", "libnl-3-200", "libnl-route-3-200", "libpci3",
              "libudev1", "zlib1g", "libgcc-s1"]
VERBS_LIBS = ["libibverbs.so.1", "librdmacm.so.1", "libnl-3.so.200", "libnl-route-3.so.200",
              "libmlx4.so.1", "libmlx5.so.1", "libefa.so.1", "libmana.so.1", "libpci.so.3",
              "libudev.so.1", "libz.so.1", "libm.so.6", "libgcc_s.so.1"]
# libibverbs' provider directory and its driver files, as the packages install them.
VERBS_PROVIDER_DIR = "usr/lib/x86_64-linux-gnu/libibverbs"
VERBS_DRIVER_DIR = "etc/libibverbs.d"
# Our provider (rdma-core's private ABI 34, as Debian 12's libibverbs): built by
# guest-user/libhcab/build.sh OUTDIR into OUTDIR/libhcab-rdmav34.so.
GUEST_USER = ROOT / "guest-user"
HCAB_PROVIDER = "libhcab-rdmav34.so"

# The shared userland: what is too big for the initramfs (every guest unpacks that at boot,
# slowly under TCG) goes on an EROFS image, userland.img beside it, that every QEMU guest of
# a cluster attaches read-only as a virtio disk and `userland-up` lays under /usr. It holds
# these Debian packages with their dependencies: python3 and pyverbs, with rdma-core's
# test suite (tests/run_tests.py), which Debian ships in python3-pyverbs' documentation.
# iproute2 too: its `ip` (/usr/bin/ip; busybox's stays /bin/ip) speaks JSON (`ip -j`), which
# the tests read an interface's address with; and libatm1, which its tc plugin q_atm links.
DISK_PACKAGES = ["python3", "python3-pyverbs", "iproute2", "libatm1"]
# Dependencies the disk leaves out: package management, users and system services (a guest
# runs busybox's init, with no dpkg, perl, udev or PAM), and the C library and its runtime,
# which the initramfs carries (what else it carries the disk holds too, whole).
DISK_SKIP = {"adduser", "cdebconf", "debconf", "dpkg", "install-info", "libdebian-installer4",
             "libnewt0.52", "libslang2", "libtextwrap1", "libpam-modules", "libpam0g",
             "libperl5.36", "lsb-base", "passwd", "perl", "perl-base", "perl-modules-5.36",
             "rdma-core", "sysvinit-utils", "tar", "udev", "libsemanage-common",
             "libsemanage2", "libsepol2", "libaudit-common", "libaudit1", "libcap-ng0",
             "libelogind0", "libacl1", "gcc-12-base", "readline-common", "mailcap",
             "media-types", "mime-support", "libpam-modules-bin", "libpam-runtime",
             "usrmerge", "usr-is-merged", "libc6", "libgcc-s1"}
# Where the disk's image keeps rdma-core's tests (unpacked; the package gzips most).
DISK_TESTS = "usr/share/rdma-core/tests"

quiet = False


def say(msg):
    # Progress goes to stderr: stdout is kept for --print-dir.
    if not quiet:
        print(f"images: {msg}", file=sys.stderr, flush=True)


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
    return {"dpkg-deb": "dpkg", "apt-get": "apt", "apt-cache": "apt", "make": "make",
            "readelf": "binutils", "objcopy": "binutils",
            "depmod": "kmod", "mkfs.erofs": "erofs-utils"}.get(tool, tool)


def apt_depends_image(pkg):
    """The kernel ABI name (6.1.0-56-amd64) the meta-package `pkg` depends on, or None."""
    out = subprocess.run(["apt-cache", "depends", pkg], text=True, capture_output=True).stdout
    m = re.search(r"Depends: linux-image-(\d\S*-(?:amd64|cloud-amd64|rt-amd64))\b", out)
    return m.group(1) if m else None


def apt_has(pkg):
    out = subprocess.run(["apt-cache", "policy", pkg], text=True, capture_output=True).stdout
    m = re.search(r"Candidate: (\S+)", out)
    return bool(m) and m.group(1) != "(none)"


def debian_kernel(spec):
    """The ABI name of the Debian kernel `spec` names: None for linux-image-amd64's (the
    default), a version (6.12, 6.1), a flavour (6.12-cloud-amd64, cloud-amd64) or an exact ABI
    name (6.12.117+deb12-amd64)."""
    default = apt_depends_image("linux-image-amd64")
    if not default:
        die("apt-cache knows no linux-image-amd64; run `apt-get update` first")
    if spec is None:
        return default
    if re.fullmatch(r"\d+\.\d+.*-(amd64|cloud-amd64|rt-amd64)", spec) and \
            not re.fullmatch(r"\d+\.\d+-(amd64|cloud-amd64|rt-amd64)", spec):
        if apt_has(f"linux-image-{spec}"):
            return spec
        die(f"Debian has no kernel package linux-image-{spec} (apt-cache search "
            f"linux-image-{spec.split('-')[0]} lists what it has)")
    for meta in [f"linux-image-{spec}-amd64", f"linux-image-{spec}"]:
        kver = apt_depends_image(meta)
        if kver:
            return kver
    # The default kernel's own version (6.1 on Debian 12) has no meta-package of its own.
    if re.fullmatch(r"\d+\.\d+", spec) and default.startswith(spec + "."):
        return default
    die(f"no Debian kernel matches `{spec}`: give a version Debian carries (e.g. 6.1, 6.12), "
        f"a flavour (6.12-cloud-amd64) or an exact name (6.12.117+deb12-amd64), or the path "
        f"of a kernel tree")


# Package -> its candidate version (None: apt has none), as `apt-cache policy` says.
_candidates = {}


def prefetch_candidates(pkgs):
    """Asks apt for the candidate versions of many packages at once (a call each took a
    third of a second, most of an up-to-date image build)."""
    want = sorted({p for p in pkgs if p not in _candidates})
    if not want:
        return
    cur = None
    for line in run(["apt-cache", "policy"] + want).splitlines():
        m = re.match(r"^(\S+?)(:amd64)?:$", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"^\s+Candidate: (\S+)", line)
        if m and cur:
            _candidates[cur] = None if m.group(1) == "(none)" else m.group(1)
    for p in want:
        _candidates.setdefault(p, None)


def download(pkg, cache):
    """Downloads a .deb into cache (once per version) and returns its path."""
    cache.mkdir(parents=True, exist_ok=True)
    prefetch_candidates([pkg])
    version = _candidates[pkg]
    if not version:
        die(f"no candidate for {pkg}; run `apt-get update`")
    # apt names files with the epoch's colon escaped.
    want = f"{pkg}_{version.replace(':', '%3a')}_"
    have = [p for p in cache.glob(f"{pkg}_*.deb") if p.name.startswith(want)]
    if have:
        return have[0]
    say(f"downloading {pkg} {version}")
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
    """Finds the compressed ELF kernel in the bzImage and writes it out; False if none is
    found in a format this can inflate (xz, gzip, and zstd where `zstd` is installed)."""
    data = bz.read_bytes()
    streams = [(b"\xfd7zXZ\x00", lambda d: lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d)),
               (b"\x1f\x8b\x08", lambda d: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(d)),
               (b"\x28\xb5\x2f\xfd", unzstd)]
    for magic, inflate in streams:
        off = data.find(magic)
        while off >= 0:
            try:
                elf = inflate(data[off:])
                if elf and elf[:4] == b"\x7fELF":
                    out.write_bytes(elf)
                    return True
            except (lzma.LZMAError, zlib.error, OSError, subprocess.SubprocessError):
                pass
            off = data.find(magic, off + 1)
    return False


def unzstd(data):
    if not shutil.which("zstd"):
        return None
    r = subprocess.run(["zstd", "-dcq"], input=data, capture_output=True)
    # A stream followed by more of the bzImage ends in an error after the whole ELF.
    return r.stdout


COMPRESSED = {".xz": lambda d: lzma.decompress(d), ".gz": lambda d: gzip.decompress(d),
              ".zst": lambda d: unzstd(d)}


class Modules:
    """A kernel's loadable modules by name, from an installed tree (lib/modules/<release>:
    Debian's package or `make modules_install`) or from a built kernel tree (modules.order),
    compressed or not; and the modules built into the kernel (modules.builtin)."""

    def __init__(self, root):
        self.root = root
        self.paths = {}
        if (root / "kernel").is_dir():
            found = (root / "kernel").rglob("*.ko*")
        else:
            found = [root / re.sub(r"\.o$", ".ko", line.strip())
                     for line in (root / "modules.order").read_text().splitlines() if line.strip()]
        for ko in found:
            name = ko.name
            for ext in COMPRESSED:
                name = name.removesuffix(ext)
            if name.endswith(".ko") and ko.is_file():
                self.paths[name[:-3].replace("-", "_")] = ko
        self.builtin = set()
        if (root / "modules.builtin").exists():
            for line in (root / "modules.builtin").read_text().splitlines():
                self.builtin.add(Path(line.strip()).name.removesuffix(".ko").replace("-", "_"))

    def has(self, name):
        name = name.replace("-", "_")
        return name in self.paths or name in self.builtin

    def closure(self, names):
        """The module names for `names` and all they depend on, dependencies first; built-in
        ones are left out (they need no loading)."""
        order, seen = [], set()

        def visit(name):
            # .modinfo spells some names with '-' (nvme-core); files and /proc use '_'.
            name = name.replace("-", "_")
            if name in seen:
                return
            seen.add(name)
            if name in self.builtin:
                return
            if name not in self.paths:
                die(f"kernel module {name} is not in {self.root}")
            m = re.search(rb"\0depends=([^\0]*)\0", self.read(name))
            for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
                visit(dep)
            order.append(name)

        for n in names:
            visit(n)
        return order

    def file_name(self, name):
        """The module's file name as the kernel built it (nvmet-rdma.ko), uncompressed: the
        guest's scripts find modules in the order files by it."""
        fname = self.paths[name].name
        for ext in COMPRESSED:
            fname = fname.removesuffix(ext)
        return fname

    def read(self, name):
        """The module's ELF, inflated if the kernel installs it compressed (busybox insmod
        hands the bytes to init_module, which wants them plain)."""
        ko = self.paths[name]
        data = ko.read_bytes()
        inflate = COMPRESSED.get(ko.suffix)
        if inflate:
            data = inflate(data)
            if not data:
                die(f"cannot inflate {ko} (for .zst: apt-get install zstd)")
        return data


def module_closure(moddir, names):
    """The .ko files (relative to moddir) for `names` and all they depend on, in load order
    (images/nested.py's way in; the package's modules uncompressed)."""
    mods = Modules(moddir)
    return [str(mods.paths[n].relative_to(moddir)) for n in mods.closure(names)]


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


def kmod_sources():
    """guest-kmod's source files, without what an in-tree build by hand leaves beside them
    (kbuild's X.mod.c holds one kernel's symbol CRCs: copied into another kernel's build, it
    would link modules that kernel refuses)."""
    return sorted(f for f in KMOD.rglob("*") if f.is_file()
                  and (f.suffix in (".c", ".h", ".sh") or f.name in ("Kbuild", "Makefile"))
                  and not f.name.endswith(".mod.c") and not f.name.startswith(".")
                  and "generated" not in f.relative_to(KMOD).parts)


def sync_tree(src, dest):
    """Copies guest-kmod's sources (not its build outputs) into dest, rewriting only files
    that changed, so that kbuild's own change tracking keeps rebuilds incremental."""
    for f in kmod_sources():
        d = dest / f.relative_to(src)
        data = f.read_bytes()
        if not d.exists() or d.read_bytes() != data:
            d.parent.mkdir(parents=True, exist_ok=True)
            d.write_bytes(data)
            shutil.copymode(f, d)


def build_our_modules(kdir, kver, builddir):
    """Builds OUR_MODULES against the kernel tree or headers at kdir, in builddir (a copy of
    guest-kmod/ for this kernel alone), through guest-kmod/Makefile: conftest first."""
    sync_tree(KMOD, builddir)
    say(f"building guest-kmod ({', '.join(OUR_MODULES)}) against {kver}")
    run(["make", "-s", "-C", str(builddir), f"KDIR={kdir}", f"MODULES={' '.join(OUR_MODULES)}"])
    return [ko for m in OUR_MODULES for ko in sorted((builddir / m).glob("*.ko"))]


# What a developer's kernel config must have for the guests to boot and hcab0 to work, and
# what only some jobs need (their modules are left out of the image when missing).
CONFIG_REQUIRED = {
    "CONFIG_MODULES": "loadable modules (hca_ib, the DSM and vbench are modules)",
    "CONFIG_PCI": "PCI (the HCA is a PCI device)",
    "CONFIG_PCI_MSI": "MSI-X interrupts (the HCA's completions and events)",
    "CONFIG_INFINIBAND": "the RDMA core, ib_core (hca_ib registers with it)",
    "CONFIG_BLK_DEV_INITRD": "an initramfs (the guest's whole root file system)",
    "CONFIG_DEVTMPFS": "devtmpfs (init mounts /dev)",
    "CONFIG_SERIAL_8250_CONSOLE": "a console on the 16550 serial port (the harness reads it)",
}
CONFIG_WANTED = {
    "CONFIG_INFINIBAND_USER_MAD": "ib_umad (saquery, ibstat, the subnet tools)",
    "CONFIG_INFINIBAND_USER_ACCESS": "ib_uverbs and rdma_ucm (user-level verbs)",
    "CONFIG_INFINIBAND_ADDR_TRANS": "rdma_cm (vbench's `vb cm`, NVMe-oF, iSER, NFS, RDS)",
    "CONFIG_INFINIBAND_IPOIB": "IPoIB (ib0; `hcabench up` brings it up on every node)",
    "CONFIG_RDMA_RXE": "SoftRoCE (the benches' peer)",
    "CONFIG_NVME_RDMA": "NVMe over Fabrics' host (`nvmeof connect`)",
    "CONFIG_NVME_TARGET_RDMA": "NVMe over Fabrics' target (`nvmeof target`)",
    "CONFIG_INFINIBAND_SRP": "SRP's initiator",
    "CONFIG_INFINIBAND_SRPT": "SRP's target",
    "CONFIG_INFINIBAND_ISER": "iSER's initiator",
    "CONFIG_INFINIBAND_ISERT": "iSER's target",
    "CONFIG_SUNRPC_XPRT_RDMA": "NFS over RDMA",
    "CONFIG_RDS_RDMA": "RDS over IB",
    "CONFIG_TIPC": "TIPC (`tipc-up`)",
    "CONFIG_TIPC_MEDIA_IB": "TIPC's InfiniBand media (`tipc bearer enable media ib`)",
    "CONFIG_PVH": "booting the ELF vmlinux through PVH (faster under QEMU than the bzImage)",
}


def read_config(path):
    """A kernel .config as {option: value}."""
    conf = {}
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"(CONFIG_\w+)=(.*)", line)
        if m:
            conf[m.group(1)] = m.group(2)
    return conf


def check_config(conf, where):
    missing = [f"  {k} ({why})" for k, why in CONFIG_REQUIRED.items() if conf.get(k) not in ("y", "m")]
    if missing:
        die(f"the kernel config {where} lacks what hcabench's guests need:\n" + "\n".join(missing)
            + "\nenable them (make menuconfig, or scripts/config --enable NAME) and rebuild")
    for k, why in CONFIG_WANTED.items():
        if conf.get(k) not in ("y", "m"):
            say(f"note: {k} is not set: no {why} in this image")


class LocalKernel:
    """A developer's kernel: a built tree, or a directory holding a bzImage or vmlinux and
    lib/modules/<release> from `make modules_install INSTALL_MOD_PATH=`."""

    def __init__(self, path):
        path = path.resolve()
        if not path.is_dir():
            die(f"--kernel {path}: no such directory (give a Debian version such as 6.12, or a "
                f"kernel tree)")
        self.path = path
        release = path / "include" / "config" / "kernel.release"
        if release.exists() and (path / "Makefile").exists():
            # A built tree: the kernel, its headers and its modules all in place.
            self.kver = release.read_text().strip()
            self.kdir = path
            self.config = path / ".config"
            self.bzimage = path / "arch" / "x86" / "boot" / "bzImage"
            self.vmlinux = path / "vmlinux"
            self.moddir = path
            if not (path / "modules.order").exists():
                die(f"{path} has no modules.order: run `make` (or `make modules`) in the tree")
        else:
            mods = sorted((path / "lib" / "modules").glob("*/")) if (path / "lib" / "modules").is_dir() else []
            if not mods:
                die(f"{path} is neither a built kernel tree (include/config/kernel.release) nor "
                    f"holds lib/modules/<release> (make modules_install INSTALL_MOD_PATH={path})")
            if len(mods) > 1:
                die(f"{path}/lib/modules holds several kernels ({', '.join(m.name for m in mods)}); "
                    f"keep one")
            self.moddir = mods[0]
            self.kver = mods[0].name
            self.kdir = mods[0] / "build"
            if not (self.kdir / "Makefile").exists():
                die(f"no kernel headers for {self.kver}: {self.kdir} should point at the built "
                    f"tree (make modules_install leaves it so), or at its headers")
            self.kdir = self.kdir.resolve()
            # The installed kernel's own config first; the tree's (or headers') after.
            self.config = next((c for c in [path / "boot" / f"config-{self.kver}",
                                            path / f"config-{self.kver}", self.kdir / ".config"]
                                if c.exists()), None)
            images = [path / "bzImage", path / "boot" / f"vmlinuz-{self.kver}",
                      path / f"vmlinuz-{self.kver}", path / "arch" / "x86" / "boot" / "bzImage"]
            self.bzimage = next((b for b in images if b.exists()), path / "bzImage")
            self.vmlinux = path / "vmlinux"
        if not self.bzimage.exists() and not self.vmlinux.exists():
            die(f"no kernel to boot in {path}: no bzImage (arch/x86/boot/bzImage, bzImage, "
                f"boot/vmlinuz-{self.kver}) and no vmlinux")
        if self.config is None or not self.config.exists():
            die(f"no kernel config for {self.kver} in {path} (.config, boot/config-{self.kver})")
        self.conf = read_config(self.config)
        check_config(self.conf, str(self.config))

    def inputs(self):
        """What the image depends on, as (name, size, mtime) of each file (hashing a tree's
        hundreds of MiB would cost more than the check saves)."""
        files = [self.bzimage, self.vmlinux, self.config] + list(Modules(self.moddir).paths.values())
        return ";".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


def guest_tools(cache):
    """The user-space tools and DSM applications, built once for every kernel's image (they
    do not depend on it): rebuilt only when a source under guest-kmod/, this script or
    Debian's libibverbs (the applications link it) changed since the last build."""
    outdir = ROOT / "target" / "guest-tools"
    stamp = outdir / ".key"
    verbs = [download(p, cache) for p in ("libibverbs-dev", "libibverbs1")]
    key = digest(kmod_sources() + [Path(__file__).resolve()],
                 "guest-tools|" + "|".join(d.name for d in verbs))
    names = USER_TOOLS + DSM_APPS
    if stamp.exists() and stamp.read_text() == key and all((outdir / n).exists() for n in names):
        return {n: (outdir / n).read_bytes() for n in names}
    tools = build_user_tools()
    tools.update(build_dsm_apps(cache))
    stamp.write_text(key)
    return tools


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


def build_dsm_apps(cache):
    """libdsm.a, then every DSM application linked against it. libdsm's user-level DSM
    (udsm.c) uses libibverbs, whose providers load as shared objects: the applications
    link Debian 12's libibverbs.so.1 and glibc dynamically (this host's glibc is the
    guests', Debian 12's; the image carries both, and check_needed holds it to that), with
    the headers of the libibverbs-dev the guests' libibverbs1 goes with."""
    outdir = ROOT / "target" / "guest-tools"
    outdir.mkdir(parents=True, exist_ok=True)
    dev = extract(download("libibverbs-dev", cache), cache / "root-libibverbs-dev")
    lib1 = extract(download("libibverbs1", cache), cache / "root-libibverbs1")
    inc, libdir = dev / "usr" / "include", lib1 / "usr" / "lib" / "x86_64-linux-gnu"
    lib = outdir / "libdsm.a"
    objs = []
    say("building guest-kmod/libdsm (libdsm.a)")
    for src in ("libdsm", "udsm"):
        obj = outdir / f"{src}.o"
        run(["gcc", "-O2", "-Wall", "-pthread", f"-I{inc}", "-c", "-o", str(obj),
             str(KMOD / "libdsm" / f"{src}.c")])
        objs.append(str(obj))
    if lib.exists():
        lib.unlink()
    run(["ar", "rcs", str(lib)] + objs)
    out = {}
    for a in DSM_APPS:
        exe = outdir / a
        say(f"building guest-kmod/apps/{a}")
        run(["gcc", "-O2", "-Wall", "-pthread", f"-I{inc}", "-o", str(exe),
             str(KMOD / "apps" / f"{a}.c"), str(lib), f"-L{libdir}", "-l:libibverbs.so.1",
             "-lm"])
        out[a] = exe.read_bytes()
    return out


def userland(cache):
    """USERLAND_TOOLS and VERBS_TOOLS with their shared libraries, and libibverbs'
    providers and driver files, from Debian's packages: ({path in image: bytes},
    {link in image: its target})."""
    debs = USERLAND_DEBS + [d for d in VERBS_DEBS if d not in USERLAND_DEBS]
    prefetch_candidates(debs)
    roots = [extract(download(p, cache), cache / f"root-{p}") for p in debs]
    files, links = {}, {}
    for tool in USERLAND_TOOLS + VERBS_TOOLS:
        for r in roots:
            for d in ["bin", "sbin", "usr/bin", "usr/sbin"]:
                if (r / d / tool).is_file():
                    files[f"bin/{tool}"] = (r / d / tool).read_bytes()
        if f"bin/{tool}" not in files:
            die(f"{tool} is in none of {', '.join(debs)}")
    # Where each library the image carries came from (its file, links resolved), so that a
    # provider the package installs as a link to one (libmlx5-rdmav34.so) links to it here.
    carried = {}
    for lib in USERLAND_LIBS + VERBS_LIBS:
        hits = [f for r in roots for f in r.rglob(lib) if f.resolve().is_file()]
        if not hits:
            die(f"{lib} is in none of {', '.join(debs)}")
        dest = "lib64" if lib.startswith("ld-linux") else "lib/x86_64-linux-gnu"
        files[f"{dest}/{lib}"] = hits[0].resolve().read_bytes()
        carried[hits[0].resolve()] = f"/{dest}/{lib}"
    for r in roots:
        pdir = r / VERBS_PROVIDER_DIR
        for f in sorted(pdir.iterdir()) if pdir.is_dir() else []:
            real = f.resolve()
            if real in carried:
                links[f"{VERBS_PROVIDER_DIR}/{f.name}"] = carried[real]
            elif real.is_file():
                files[f"{VERBS_PROVIDER_DIR}/{f.name}"] = real.read_bytes()
        for f in sorted((r / VERBS_DRIVER_DIR).glob("*.driver")):
            files[f"{VERBS_DRIVER_DIR}/{f.name}"] = f.read_bytes()
    # Every driver file names a provider that is here (libibverbs warns of each missing one
    # every time a program opens the device list).
    for path, data in files.items():
        if path.startswith(VERBS_DRIVER_DIR + "/"):
            name = data.decode().split()[1]
            so = f"{VERBS_PROVIDER_DIR}/lib{name}-rdmav34.so"
            if so not in files and so not in links:
                die(f"{path} names provider {name}, but {so} is in none of {', '.join(debs)}")
    return files, links


def elf_needed(data):
    """The DT_NEEDED names of a 64-bit ELF file's dynamic section; [] where it has none
    (a static binary, a kernel module) or is no 64-bit ELF."""
    if data[:5] != b"\x7fELF\x02":
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names = []
    for _, stype, _, _, off, size, link, _, _, entsize in sections:
        if stype != 6:  # SHT_DYNAMIC
            continue
        stroff = sections[link][4]
        for i in range(0, size, entsize or 16):
            tag, val = struct.unpack_from("<qQ", data, off + i)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                names.append(data[stroff + val:end].decode())
    return names


def check_needed(files, links, how="add each to USERLAND_LIBS or VERBS_LIBS, and its "
                 "package to the _DEBS list"):
    """Dies naming each shared library a carried program or library needs and the image
    lacks (where the loader looks: lib/x86_64-linux-gnu, usr/lib/x86_64-linux-gnu, lib64);
    `links` counts as the image's too (paths only)."""
    # UCX's transport modules find each other through their RUNPATH, its module directory.
    libdirs = {"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64",
               "usr/lib/x86_64-linux-gnu/ucx"}
    have = {Path(p).name for p in list(files) + list(links) if str(Path(p).parent) in libdirs}
    missing = {}
    for path, data in files.items():
        for lib in elf_needed(data):
            if lib not in have:
                missing.setdefault(lib, []).append(path)
    if missing:
        die("the image lacks shared libraries its programs need:\n" + "\n".join(
            f"  {lib} (for {', '.join(sorted(users))})" for lib, users in sorted(missing.items()))
            + "\n" + how)


def guest_user_sources():
    """guest-user/'s source files (git's tracked and untracked-not-ignored files where git
    answers, all files otherwise), without build directories."""
    if not GUEST_USER.is_dir():
        return []
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z",
                        "--", str(GUEST_USER.relative_to(ROOT))], capture_output=True)
    if r.returncode == 0:
        found = [ROOT / f.decode() for f in r.stdout.split(b"\0") if f]
    else:
        found = list(GUEST_USER.rglob("*"))
    skip = {"build", "target", "out", "__pycache__", ".git"}
    return sorted(f for f in found if f.is_file() and not f.name.startswith(".")
                  and not skip & set(f.relative_to(GUEST_USER).parts[:-1]))


def hcab_provider(cache):
    """Our libibverbs provider and the hostile-process test built with it (uverbs-hostile),
    by guest-user/libhcab/build.sh (once for its sources and Debian's libibverbs: they are
    no kernel's): {path in image: bytes}, empty, said on stderr, where that script is not in
    the tree."""
    script = GUEST_USER / "libhcab" / "build.sh"
    if not script.exists():
        print(f"images: note: {script.relative_to(ROOT)} is not there: this image has no hcab "
              f"provider ({HCAB_PROVIDER}), so user-level verbs (ibv_devinfo, "
              f"perftest, rping) will not see hcab0", file=sys.stderr, flush=True)
        return {}
    outdir = ROOT / "target" / "guest-user" / "libhcab"
    stamp, so, hostile = outdir / ".key", outdir / HCAB_PROVIDER, outdir / "uverbs-hostile"

    def files():
        return {f"{VERBS_PROVIDER_DIR}/{HCAB_PROVIDER}": strip_debug(so),
                f"{VERBS_DRIVER_DIR}/hcab.driver": b"driver hcab\n",
                "bin/uverbs-hostile": strip_debug(hostile)}

    key = digest(guest_user_sources(), f"libhcab|{download('libibverbs1', cache).name}")
    if stamp.exists() and stamp.read_text() == key and so.exists() and hostile.exists():
        return files()
    say(f"building guest-user/libhcab ({HCAB_PROVIDER})")
    outdir.mkdir(parents=True, exist_ok=True)
    so.unlink(missing_ok=True)
    run(["bash", str(script), str(outdir)], cwd=ROOT)
    for f in (so, hostile):
        if not f.is_file():
            die(f"{script.relative_to(ROOT)} {outdir} made no {f.name}")
    stamp.write_text(key)
    return files()


def disk_closure(packages):
    """`packages` and every package they depend on (Depends and Pre-Depends, every
    alternative), less DISK_SKIP's, sorted."""
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + packages)
    names = {line.strip() for line in out.splitlines()
             if line.strip() and not line.startswith(" ") and not line.startswith("<")}
    missing = [p for p in packages if p not in names]
    if missing:
        die(f"apt-cache knows no package {', '.join(missing)}; run `apt-get update`")
    # A package asked for by name is carried even where DISK_SKIP would leave it out.
    return sorted(names - (DISK_SKIP - set(packages)))


def userland_disk(cache, img, packages, have, programs=None):
    """img (a path ending in .img): an EROFS image of `packages` with their dependencies
    (see DISK_PACKAGES), rebuilt only when the packages' versions change. `have` is what
    the initramfs holds ({path: bytes}, links): every ELF file on the disk must find the
    libraries it needs in one of the two; `programs` ({path: bytes}) go on the disk too.
    Returns the disk's package list."""
    programs = programs or {}
    names = disk_closure(packages)
    prefetch_candidates(names)
    debs = [download(p, cache) for p in names]
    stamp = img.with_suffix(".key")
    h = hashlib.sha256("|".join(["userland-3-erofs", DISK_TESTS] + [d.name for d in debs])
                       .encode())
    for path, data in sorted(programs.items()):
        h.update(path.encode() + hashlib.sha256(data).digest())
    key = h.hexdigest()
    if img.exists() and stamp.exists() and stamp.read_text() == key:
        return [d.name for d in debs]
    say(f"userland disk: {len(debs)} packages ({', '.join(packages)} and their dependencies)")
    with tempfile.TemporaryDirectory(dir=img.parent) as tmp:
        tree = Path(tmp) / "root"
        tree.mkdir()
        for d in debs:
            run(["dpkg-deb", "-x", str(d), str(tree)])
        # The initramfs's /bin, /lib and /lib64 stay its own: the disk is laid under /usr
        # only, so what a package installs in /bin, /sbin or /lib moves there (Debian 12's
        # merged /usr does the same with links).
        for top in ["bin", "sbin", "lib"]:
            src = tree / top
            if src.is_dir() and not src.is_symlink():
                shutil.copytree(src, tree / "usr" / top, symlinks=True, dirs_exist_ok=True)
                shutil.rmtree(src)
        shutil.rmtree(tree / "lib64", ignore_errors=True)
        # A link to /bin/ip (iproute2's /sbin/ip) would lead to busybox's in the guest.
        for f in tree.rglob("*"):
            target = os.readlink(f) if f.is_symlink() else ""
            if re.match(r"/(bin|sbin|lib)/", target):
                f.unlink()
                f.symlink_to("/usr" + target)
        tests = tree / "usr/share/doc/rdma-core/tests"
        if tests.is_dir():
            (tree / DISK_TESTS).mkdir(parents=True)
            for f in sorted(tests.iterdir()):
                data = f.read_bytes()
                name = f.name
                if name.endswith(".gz"):
                    data, name = gzip.decompress(data), name[:-3]
                (tree / DISK_TESTS / name).write_bytes(data)
        # Links Debian makes with update-alternatives in a package's postinst, which an
        # unpacked disk never runs: Open MPI's libfabric needs PSM's by this name.
        for link, pattern in DISK_ALTERNATIVES:
            hits = sorted(tree.glob(pattern))
            if hits and not (tree / link).exists():
                (tree / link).symlink_to("/" + str(hits[-1].relative_to(tree)))
        for path, data in programs.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_bytes(data)
            (tree / path).chmod(0o755)
        for doc in ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
                    "usr/share/lintian"]:
            shutil.rmtree(tree / doc, ignore_errors=True)
        elves, libs = {}, {}
        for f in tree.rglob("*"):
            rel = str(f.relative_to(tree))
            if ".so" in f.name:
                libs[rel] = ""
            if f.is_file() and not f.is_symlink():
                with open(f, "rb") as fh:
                    if fh.read(5) == b"\x7fELF\x02":
                        elves[rel] = f.read_bytes()
        check_needed(elves, {**have[1], **libs, **dict.fromkeys(have[0], "")},
                     "add its package to DISK_PACKAGES, or take it out of DISK_SKIP")
        tmpimg = Path(tmp) / "userland.img"
        # Uncompressed (a TCG guest would spend on LZ4 what it saves on reads), owned by
        # root, with one timestamp: the same packages make the same image.
        run(["mkfs.erofs", "--quiet", "--all-root", "-T0", str(tmpimg), str(tree)])
        os.replace(tmpimg, img)
    stamp.write_text(key)
    say(f"userland disk: {img.stat().st_size >> 20} MiB -> {img}")
    return [d.name for d in debs]


def strip_debug(ko):
    """The module without its debugging sections (`make INSTALL_MOD_STRIP=1`'s way): our
    modules build with the kernel's DWARF, about 5 MiB each that the guest never reads and
    would unpack at every boot. The kbuild directory keeps them whole for a post-mortem."""
    with tempfile.TemporaryDirectory(prefix="hcab-strip-") as tmp:
        out = Path(tmp) / ko.name
        run(["objcopy", "--strip-debug", str(ko), str(out)])
        return out.read_bytes()


def depmod(kver, modules, moddir):
    """The indexes kmod's depmod makes for `modules` ({path under lib/modules/<kver>:
    bytes}) and the kernel's built-in ones (moddir's modules.builtin*): {file name: bytes}
    (modules.dep, modules.alias, modules.symbols, their .bin forms, ...), so that modprobe
    finds modules by name, alias and dependency in the guest: busybox's, which the guest's
    shell runs (busybox's sh runs its own applets whatever PATH says) and the kernel too
    when it asks for a module (init makes /sbin/modprobe)."""
    tool = shutil.which("depmod") or next(
        (t for t in ["/usr/sbin/depmod", "/sbin/depmod"] if Path(t).exists()), None)
    if tool is None:
        die("`depmod` not found (it makes the guests' modules.dep); on Debian: "
            "apt-get install -y kmod")
    with tempfile.TemporaryDirectory(prefix="hcab-depmod-") as tmp:
        d = Path(tmp) / "lib" / "modules" / kver
        for path, data in modules.items():
            (d / path).parent.mkdir(parents=True, exist_ok=True)
            (d / path).write_bytes(data)
        for f in ["modules.builtin", "modules.builtin.modinfo"]:
            if (moddir / f).is_file():
                shutil.copyfile(moddir / f, d / f)
        out = run([tool, "-b", tmp, kver])
        if out.strip():
            say(f"depmod: {out.strip()}")
        return {f.name: f.read_bytes() for f in sorted(d.glob("modules.*"))}


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

    def symlink(self, name, target):
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

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


def has_pvh_note(vmlinux):
    """Whether an ELF kernel has the Xen PVH entry note QEMU boots it through."""
    r = subprocess.run(["readelf", "-n", str(vmlinux)], capture_output=True, text=True)
    return r.returncode == 0 and "Xen" in r.stdout and "PHYS32_ENTRY" in r.stdout.replace(" ", "_").upper()


def kernel_files(kernel, dest):
    """Writes dest/vmlinux (what QEMU boots: the ELF kernel through PVH where it can, else the
    bzImage itself) and dest/bzImage (what the KVM VMM boots)."""
    if kernel.bzimage.exists():
        shutil.copyfile(kernel.bzimage, dest / "bzImage")
        if vmlinux_from_bzimage(kernel.bzimage, dest / "vmlinux") and \
                kernel.conf.get("CONFIG_PVH") == "y":
            return
    if kernel.vmlinux.exists() and kernel.conf.get("CONFIG_PVH") == "y":
        shutil.copyfile(kernel.vmlinux, dest / "vmlinux")
        if not kernel.bzimage.exists():
            # The KVM VMM boots an ELF vmlinux as well (linux-loader).
            shutil.copyfile(kernel.vmlinux, dest / "bzImage")
        return
    if not kernel.bzimage.exists():
        die(f"{kernel.vmlinux} cannot boot under QEMU without CONFIG_PVH, and there is no bzImage")
    say("booting the bzImage itself under QEMU (no CONFIG_PVH, or its compression is not "
        "one this reads): a few seconds slower than the ELF kernel")
    shutil.copyfile(kernel.bzimage, dest / "vmlinux")


class DebianKernel:
    """Debian's kernel package, downloaded into the cache and unpacked there."""

    def __init__(self, kver, cache):
        self.kver = kver
        self.deb = download(f"linux-image-{kver}", cache)
        self.cache = cache

    def unpack(self):
        root = extract(self.deb, self.cache / f"root-{self.deb.stem}")
        self.bzimage = root / "boot" / f"vmlinuz-{self.kver}"
        self.vmlinux = root / "vmlinux"  # never in the package
        self.conf = read_config(root / "boot" / f"config-{self.kver}")
        self.moddir = root / "lib" / "modules" / self.kver
        self.kdir = headers_dir(self.kver)


# Alternatives' links a disk makes itself: (link, the glob of what it points to).
DISK_ALTERNATIVES = [("usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1",
                      "usr/lib/libpsm1/libpsm_infinipath.so.1.*")]
# guest-user/mpi/'s programs, built against each MPI Debian has (its -dev package's mpi.h,
# linked to its library package's libmpi) and carried in /usr/bin of a disk that has that
# library: (library package, -dev package, include dir, lib dir, library, name suffix).
MPI_FLAVOURS = [
    ("libmpich12", "libmpich-dev", "usr/include/x86_64-linux-gnu/mpich",
     "usr/lib/x86_64-linux-gnu", "mpich", ""),
    ("libopenmpi3", "libopenmpi-dev", "usr/lib/x86_64-linux-gnu/openmpi/include",
     "usr/lib/x86_64-linux-gnu/openmpi/lib", "mpi", ".openmpi"),
]
MPI_SOURCES = GUEST_USER / "mpi"


def mpi_programs(cache, closure):
    """guest-user/mpi/*.c built against each MPI in `closure` (the disk's packages):
    {path on the disk: bytes}, MPICH's as NAME, Open MPI's as NAME.openmpi. No mpicc is
    needed: the packages are unpacked, not installed, and the MPI library's own
    dependencies (UCX, hwloc) are the guest's business (the disk carries them)."""
    sources = sorted(MPI_SOURCES.glob("*.c")) if MPI_SOURCES.is_dir() else []
    out = {}
    for lib_pkg, dev_pkg, inc, libdir, lib, suffix in MPI_FLAVOURS:
        if not sources or lib_pkg not in closure:
            continue
        root = cache / f"root-{dev_pkg}"
        key = "|".join(download(p, cache).name for p in (dev_pkg, lib_pkg))
        if not (root / ".done").exists() or (root / ".done").read_text() != key:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            for p in (dev_pkg, lib_pkg):
                run(["dpkg-deb", "-x", str(download(p, cache)), str(root)])
            (root / ".done").write_text(key)
        outdir = ROOT / "target" / "guest-user" / "mpi" / dev_pkg
        outdir.mkdir(parents=True, exist_ok=True)
        stamp = outdir / ".key"
        built = digest(sources, key)
        fresh = stamp.exists() and stamp.read_text() == built
        for src in sources:
            exe = outdir / (src.stem + suffix)
            if not (fresh and exe.is_file()):
                say(f"building guest-user/mpi/{src.name} for {lib_pkg}")
                run(["gcc", "-O2", "-Wall", "-I", str(root / inc), "-o", str(exe), str(src),
                     "-L", str(root / libdir), f"-l{lib}", "-Wl,--allow-shlib-undefined"])
            out[f"usr/bin/{exe.name}"] = strip_debug(exe)
        stamp.write_text(built)
    return out


def package_disk(out, cache, extra):
    """`--package`: the userland disk with a user's packages too, named by the set of
    package names (OUT/userland/<hash>.img), built unless up to date; its path on stdout."""
    bad = [p for p in extra if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", p)]
    if bad:
        die(f"not a Debian package name: {', '.join(bad)}")
    names = sorted(set(DISK_PACKAGES) | set(extra))
    tag = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    dest = out / "userland"
    dest.mkdir(parents=True, exist_ok=True)
    img = dest / f"{tag}.img"
    # What the initramfs carries (the disk's programs may use its libraries): the same
    # whatever the kernel.
    files, links = userland(cache)
    files.update(hcab_provider(cache))
    programs = mpi_programs(cache, disk_closure(names))
    userland_disk(cache, img, names, (files, links), programs)
    (dest / f"{tag}.packages").write_text("".join(n + "\n" for n in names))
    print(img)


def main():
    global quiet
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Example: images/build.py --kernel 6.12; "
                                 "images/build.py --kernel ~/src/linux")
    ap.add_argument("--kernel", metavar="VERSION|PATH",
                    help="a Debian kernel (6.12, 6.12-cloud-amd64, 6.12.117+deb12-amd64; default: "
                    "linux-image-amd64's) or the path of a developer's kernel tree or install "
                    "directory")
    ap.add_argument("--out", default=str(ROOT / "target" / "images"), help="output directory")
    ap.add_argument("--print-dir", action="store_true",
                    help="print the image's directory on stdout when done (for scripts)")
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    ap.add_argument("--package", action="append", default=[], metavar="NAME",
                    help="build only a shared userland disk (no kernel or initramfs): "
                    f"{', '.join(DISK_PACKAGES)} and this Debian package, with their "
                    "dependencies, as OUT/userland/<hash>.img, whose path is printed on "
                    "stdout (repeat for more packages; a cluster file's `packages` does "
                    "this)")
    args = ap.parse_args()
    quiet = args.quiet
    out = Path(args.out)
    started = time.monotonic()
    cache = out / "cache"
    if args.package:
        return package_disk(out, cache, args.package)

    spec = args.kernel
    local = spec is not None and ("/" in spec or spec.startswith(".") or Path(spec).is_dir())
    if local:
        kernel = LocalKernel(Path(spec).expanduser())
        name, source = f"local-{kernel.kver}", str(kernel.path)
        kinputs = kernel.inputs()
    else:
        kernel = DebianKernel(debian_kernel(spec), cache)
        name, source = kernel.kver, kernel.deb.name
        kinputs = kernel.deb.name
    kver = kernel.kver
    bdeb = download("busybox-static", cache)
    init = ROOT / "images" / "init.sh"
    sources = [bdeb, init, Path(__file__).resolve()]
    sources += [ROOT / "images" / n for n in SCRIPTS]
    sources += kmod_sources()
    # Our provider: rebuilt, and the image with it, when guest-user/ changes.
    sources += guest_user_sources()
    key = digest(sources, f"{kver}|{kinputs}")
    dest = out / name
    manifest = dest / "manifest.json"

    def done():
        if spec is None:
            (out / "current").write_text(kver + "\n")
        if args.print_dir:
            print(dest)

    if manifest.exists() and json.loads(manifest.read_text()).get("key") == key:
        say(f"{name}: up to date ({dest})")
        return done()

    if not local:
        kernel.unpack()
    broot = extract(bdeb, cache / f"root-{bdeb.stem}")
    dest.mkdir(parents=True, exist_ok=True)
    say(f"{name}: kernel {kver}")
    kernel_files(kernel, dest)

    ours = build_our_modules(kernel.kdir, kver, out.parent / "kbuild" / name)
    tools = guest_tools(cache)
    debian_tools, debian_links = userland(cache)
    debian_tools.update(hcab_provider(cache))
    check_needed({**debian_tools, **{f"bin/{t}": d for t, d in tools.items()}}, debian_links)
    disk = userland_disk(cache, dest / "userland.img", DISK_PACKAGES,
                         (debian_tools, debian_links))
    mods = Modules(kernel.moddir)
    img = Cpio()
    made = set()

    def mkdir(d):
        # The directory and each above it (the kernel makes no missing parent of an entry).
        parts = Path(d).parts
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in made:
                img.dir(sub)
                made.add(sub)

    def mkdirs(path):
        mkdir(str(Path(path).parent))

    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "lib", "lib64",
              "lib/x86_64-linux-gnu", "lib/modules", f"lib/modules/{kver}",
              f"lib/modules/{kver}/kernel", f"lib/modules/{kver}/extra"]:
        mkdir(d)
    img.file("bin/busybox", (broot / "bin" / "busybox").read_bytes(), 0o755)
    img.file("init", init.read_bytes(), 0o755)
    for script in SCRIPTS:
        img.file(f"bin/{script}", (ROOT / "images" / script).read_bytes(), 0o755)
    for tname, data in tools.items():
        img.file(f"bin/{tname}", data, 0o755)
    for path, data in debian_tools.items():
        mkdirs(path)
        img.file(path, data, 0o644 if path.startswith("etc/") else 0o755)
    for path, target in debian_links.items():
        mkdirs(path)
        img.symlink(path, target)
    # Each order lists its whole closure (modload skips what is loaded); each module file
    # goes into the image once, uncompressed. brd takes its size as a parameter: its users
    # load it. A developer's kernel may lack a job's modules (its config said so above):
    # that job's order is left empty, and the job says what is missing when run.
    packed, orders, modules = set(), {}, {}
    for order_name, names, _ in ORDERS:
        lacking = [n for n in names if not mods.has(n)]
        if lacking and not local:
            die(f"Debian's {kver} has no module {', '.join(lacking)}")
        if order_name == "load":
            # Boot needs ib_core alone (the config check made sure of it); the rest serve
            # the subnet tools and user-level verbs, and are loaded where the kernel has them.
            if lacking:
                say(f"note: {kver} has no {', '.join(lacking)}: not loaded at boot")
            names, lacking = [n for n in names if mods.has(n)], []
        order = []
        for mod in ([] if lacking else mods.closure(names)):
            fname = f"kernel/{mods.file_name(mod)}"
            if fname not in packed:
                modules[fname] = mods.read(mod)
                img.file(f"lib/modules/{kver}/{fname}", modules[fname])
                packed.add(fname)
            if mod != "brd":  # (its users load it with its size)
                order.append(fname)
        if lacking:
            say(f"note: no {order_name} job in this image: {kver} has no {', '.join(lacking)}")
        orders[order_name] = order
        img.file(f"lib/modules/{kver}/{order_name}-order", "".join(m + "\n" for m in order).encode())
    for ko in ours:
        modules[f"extra/{ko.name}"] = strip_debug(ko)
        img.file(f"lib/modules/{kver}/extra/{ko.name}", modules[f"extra/{ko.name}"])
    # modprobe's indexes of every module the image carries, Debian's and ours.
    for fname, data in depmod(kver, modules, kernel.moddir).items():
        img.file(f"lib/modules/{kver}/{fname}", data)
    # Uncompressed: a TCG guest copies 57 MB in a fraction of the time it inflates 20 MB of
    # gzip (8 guests booting at once on 2 cores: about 6 s less). The cost is 37 MB more of
    # a guest's RAM while it unpacks, given back once it has.
    (dest / "initramfs.cpio").write_bytes(img.finish())
    (dest / "initramfs.cpio.gz").unlink(missing_ok=True)  # (what images before this made)
    manifest.write_text(json.dumps({
        "key": key, "kernel": kver, "kernel_source": source,
        "kernel_deb": None if local else kernel.deb.name, "busybox_deb": bdeb.name,
        **{mkey: orders[order_name] for order_name, _, mkey in ORDERS},
        "our_modules": [k.name for k in ours], "tools": sorted(tools) + sorted(debian_tools),
        "links": debian_links, "userland_disk": disk, "hcab_provider": f"{VERBS_PROVIDER_DIR}/{HCAB_PROVIDER}" in debian_tools,
    }, indent=2) + "\n")
    say(f"{name}: built in {time.monotonic() - started:.1f}s -> {dest}")
    done()


if __name__ == "__main__":
    main()
