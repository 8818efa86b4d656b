#!/usr/bin/env bash
# A real KVM on a machine without one: boots a QEMU TCG guest ("L1") whose `-cpu max` has
# AMD SVM with nested paging, loads Debian's kvm_amd in it and runs commands there, where
# /dev/kvm runs Linux guests ("L2") as hardware KVM does. hcabench's own VMM is tested on it.
#
# Usage: ci/nested-kvm.sh [options] -c 'COMMANDS'    (or a script file instead of -c)
#   --with-qemu     also carry this host's qemu-system-x86_64 into L1 (reference boots
#                   under QEMU/KVM: qemu-system-x86_64 -accel kvm ...)
#   --timeout S     give up on L1 after S seconds (default 1800)
#   --cpus N        L1's vCPUs (default 2)      --mem MIB   L1's RAM (default 3072)
#   --tcg MODE      multi (a host thread per L1 vCPU, the default) or single (one for all).
#                   One L2 guest runs well either way; two at once have crashed L1's kernel
#                   (multi) or hung L1 (single): see the README
# In L1 the working directory is /opt/hcabench (hcabench on the PATH, the guest image in
# target/images), the run directory /run; the commands' output comes back on L1's console,
# which is also kept in target/nested/console.log. The exit status is the commands'.
# Needs the guest image (python3 images/build.py, or ci/setup.sh) and qemu-system-x86.
set -euo pipefail
cd "$(dirname "$0")/.."

with_qemu=
timeout=1800
cpus=2
mem=3072
tcg=multi
job=
while [ $# -gt 0 ]; do
	case "$1" in
	--with-qemu) with_qemu=--with-qemu ;;
	--timeout) timeout=$2; shift ;;
	--cpus) cpus=$2; shift ;;
	--mem) mem=$2; shift ;;
	--tcg) tcg=$2; shift ;;
	-c)
		job=$(mktemp)
		trap 'rm -f "$job"' EXIT
		printf '%s\n' "$2" > "$job"
		shift
		;;
	-h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "nested-kvm: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) job=$1 ;;
	esac
	shift
done
[ -n "$job" ] || { echo "nested-kvm: no commands given (see --help)" >&2; exit 2; }

out=target/nested
mkdir -p "$out"
step() { printf '==> nested-kvm: %s\n' "$*" >&2; }

step "building a static hcabench"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -q \
	--target x86_64-unknown-linux-gnu -p hcabench
bin=target/x86_64-unknown-linux-gnu/release/hcabench

step "packing L1's initramfs"
python3 images/nested.py --hcabench "$bin" --job "$job" --out "$out/l1-initrd" $with_qemu
kver=$(cat target/images/current)

step "booting L1 (QEMU TCG $tcg-threaded, -cpu max, $cpus vCPUs, $mem MiB); output follows"
# The guest's console is this script's output; QEMU's own messages go to qemu.log.
set +e
timeout --foreground -k 10 "$timeout" qemu-system-x86_64 \
	-accel "tcg,thread=$tcg" -cpu max -smp "$cpus" -m "$mem" \
	-kernel "target/images/$kver/vmlinux" -initrd "$out/l1-initrd" \
	-append "console=ttyS0 panic=-1 quiet" \
	-nodefaults -nographic -no-reboot -serial stdio -monitor none \
	2> "$out/qemu.log" < /dev/null | tee "$out/console.log"
qemu_rc=${PIPESTATUS[0]}
set -e
if [ "$qemu_rc" = 124 ]; then
	echo "nested-kvm: L1 ran past ${timeout}s and was stopped" >&2
	exit 124
fi
rc=$(sed -n 's/^NESTED-EXIT \([0-9]*\).*/\1/p' "$out/console.log" | tail -1)
if [ -z "$rc" ]; then
	echo "nested-kvm: L1 ended without running the commands to the end (QEMU exit $qemu_rc;" \
		"see $out/console.log and $out/qemu.log)" >&2
	exit 1
fi
exit "$rc"
