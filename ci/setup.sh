#!/usr/bin/env bash
# Installs what a fresh machine lacks (apt, as root) and builds the guest image.
# Sourced or run by ci/test.sh and demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
# vbench-user, a guest tool, is linked statically.
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_apt+=(libc6-dev)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_apt+=(qemu-system-x86)
# The capture tests decode hcabench's pcap files with Wireshark's dissectors.
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
# The image builder runs depmod for the guests' modprobe and strips our modules (objcopy);
# the provider's build (guest-user/libhcab/build.sh) fetches rdma-core's tree with curl.
{ command -v depmod || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ]; } >/dev/null 2>&1 ||
	need_apt+=(kmod)
command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
# images/build.py makes the shared userland disk (an EROFS image) with mkfs.erofs.
command -v mkfs.erofs >/dev/null 2>&1 || need_apt+=(erofs-utils)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ "$(id -u)" -ne 0 ]; then
	if [ ${#need_apt[@]} -gt 0 ]; then
		echo "missing: ${need_apt[*]}; run: sudo apt-get install -y ${need_apt[*]}" >&2
		exit 1
	fi
else
	# The image builder asks apt which kernel linux-image-amd64 means today.
	step "apt-get update"
	apt-get update -q >/dev/null
	if [ ${#need_apt[@]} -gt 0 ]; then
		step "installing ${need_apt[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
	fi
fi
if ! command -v cargo >/dev/null 2>&1; then
	echo "cargo not found: install Rust (https://rustup.rs) and re-run" >&2
	exit 1
fi

step "guest image (Debian kernel, busybox, our modules)"
python3 images/build.py
# The test command (ci/test.sh) also runs a set of end-to-end checks on a second kernel,
# Debian 12's newer one (docs/kernels.md); it names it here.
if [ -n "${HCABENCH_SECOND_KERNEL:-}" ]; then
	step "guest image of the second kernel, $HCABENCH_SECOND_KERNEL"
	python3 images/build.py --kernel "$HCABENCH_SECOND_KERNEL"
fi
