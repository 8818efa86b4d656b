#!/usr/bin/env bash
# A real KVM on a machine without one: boots a QEMU TCG guest ("L1") whose `-cpu max` has
# AMD SVM with nested paging, loads Debian's kvm_amd in it and runs commands there, where
# /dev/kvm runs Linux guests ("L2") as hardware KVM does. hcabench's own VMM is tested on it.
#
# Usage: ci/nested-kvm.sh [options] -c 'COMMANDS'    (or a script file instead of -c)
#   --with-qemu     also carry this host's qemu-system-x86_64 into L1 (reference boots
#                   under QEMU/KVM: qemu-system-x86_64 -accel kvm ...)
#   --timeout S     give up on L1 after S seconds (default 1800)
#   --retries N     when L1's own kernel reports a soft lockup, a panic, a corrupted stack
#                   or a task blocked in it for a minute, or L1 stops printing its heartbeat
#                   (the nested host broke, not the commands), boot it again, up to N times
#                   (default 0); each broken console is kept. Failing commands never retry
#   --kernel K      L1 and L2 boot this built image's kernel (a name or Debian version,
#                   e.g. 6.12; default: the default image's)
#   --cpus N        L1's vCPUs (default 2)      --mem MIB   L1's RAM (default 3072)
#   --tcg MODE      multi (a host thread per L1 vCPU, the default) or single (one for all)
#   --no-pin        run the commands on every L1 CPU. By default they run on L1's CPU 0
#                   alone (taskset): when two L1 CPUs take part in running L2 guests, this
#                   nested host corrupts or wedges L1 now and then (kernel stack corruption,
#                   soft lockups, L2 triple faults; see docs/verification.md); pinned it has not failed.
#                   A 2-vCPU L2 needs --no-pin (pinned, it hangs L1)
# In L1 the working directory is /opt/hcabench (hcabench on the PATH, the guest image in
# target/images), the run directory /run; the commands' output comes back on L1's console,
# which is also kept in target/nested/console.log (L1's kernel log: kernel.log). The exit
# status is the commands'; 125 when L1 broke, 124 past the time limit.
# Needs the guest image (python3 images/build.py, or ci/setup.sh) and qemu-system-x86.
set -euo pipefail
cd "$(dirname "$0")/.."

with_qemu=
timeout=1800
cpus=2
mem=3072
tcg=multi
pin=1
retries=0
kernel=()
cmds=
while [ $# -gt 0 ]; do
	case "$1" in
	--with-qemu) with_qemu=--with-qemu ;;
	--timeout) timeout=$2; shift ;;
	--cpus) cpus=$2; shift ;;
	--mem) mem=$2; shift ;;
	--tcg) tcg=$2; shift ;;
	--no-pin) pin= ;;
	--retries) retries=$2; shift ;;
	--kernel) kernel=(--kernel "$2"); shift ;;
	-c)
		cmds=$2
		shift
		;;
	-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "nested-kvm: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) cmds=$(cat "$1") ;;
	esac
	shift
done
[ -n "$cmds" ] || { echo "nested-kvm: no commands given (see --help)" >&2; exit 2; }
job=$(mktemp)
qemu_pid=
trap 'rm -f "$job"; [ -z "$qemu_pid" ] || kill "$qemu_pid" 2> /dev/null' EXIT
{
	# The job's shell, and so every process it starts, on L1's CPU 0.
	[ -n "$pin" ] && echo 'taskset -p 1 $$ > /dev/null || echo "NESTED-ERROR taskset"'
	printf '%s\n' "$cmds"
} > "$job"

out=target/nested
mkdir -p "$out"
step() { printf '==> nested-kvm: %s\n' "$*" >&2; }

step "building a static hcabench"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -q \
	--target x86_64-unknown-linux-gnu -p hcabench
bin=target/x86_64-unknown-linux-gnu/release/hcabench

step "packing L1's initramfs"
kver=$(python3 images/nested.py --hcabench "$bin" --job "$job" --out "$out/l1-initrd" \
	$with_qemu "${kernel[@]}")

# L1's own kernel alarms on its kernel log (ttyS1; the commands write to ttyS0): the nested
# host broke, not the commands. A user-space VMM cannot leave a task blocked in the kernel
# for a minute (its vCPU threads sleep interruptibly when L2 idles); L1's KVM can.
broke_signs='soft lockup|Kernel panic|stack guard page was hit|corrupted stack end|BUG: |blocked for more than'
# L1's init prints a heartbeat every 20 s (images/nested-init.sh); a console silent this
# long means L1 itself is wedged (seen in CI: no alarm, no output, until the time limit).
silence_limit=150

# L1's first alarm, as "\"LINE\" in its kernel log" (the line, without its timestamp), or
# nothing.
alarm() {
	local line
	line=$(grep -m1 -E "$broke_signs" "$out/kernel.log" | sed 's/^\[ *[0-9.]*\] //' || true)
	[ -z "$line" ] || echo "\"$line\" in its kernel log"
}

# Stops L1: SIGTERM to its QEMU, SIGKILL should it still run 10 s on. QEMU may have ended
# on its own meanwhile (a panicking L1 reboots, and -no-reboot ends QEMU): no error, where
# a failing `kill` would end this script (set -e) before it retries or says why.
stop_l1() {
	kill "$qemu_pid" 2> /dev/null || return 0
	local waited=0
	while kill -0 "$qemu_pid" 2> /dev/null; do
		if [ "$waited" -ge 10 ]; then
			echo "nested-kvm: L1's QEMU ignored SIGTERM for 10 s; killing it" >&2
			kill -KILL "$qemu_pid" 2> /dev/null || true
			return 0
		fi
		sleep 1
		waited=$((waited + 1))
	done
}

# Boots L1 once, showing its console as it goes; sets qemu_rc, and broke (the first alarm
# seen) or timed_out. Stops L1 at its first alarm rather than waiting out the time limit.
boot_l1() {
	broke=
	timed_out=
	qemu_rc=0
	: > "$out/console.log"
	: > "$out/kernel.log"
	qemu-system-x86_64 \
		-accel "tcg,thread=$tcg" -cpu max -smp "$cpus" -m "$mem" \
		-kernel "target/images/$kver/vmlinux" -initrd "$out/l1-initrd" \
		-append "console=ttyS1 panic=-1 quiet" \
		-nodefaults -nographic -no-reboot -monitor none \
		-serial stdio -serial "file:$out/kernel.log" \
		2> "$out/qemu.log" < /dev/null > "$out/console.log" &
	qemu_pid=$!
	# Shown without the heartbeat (it stays in console.log).
	tail -n +1 -f --pid="$qemu_pid" "$out/console.log" | grep --line-buffered -v '^NESTED-ALIVE' &
	local tail_pid=$! started=$SECONDS size=0 heard=$SECONDS now_size
	while kill -0 "$qemu_pid" 2> /dev/null; do
		broke=$(alarm)
		now_size=$(stat -c %s "$out/console.log")
		if [ "$now_size" != "$size" ]; then
			size=$now_size
			heard=$SECONDS
		elif [ $((SECONDS - heard)) -ge "$silence_limit" ]; then
			broke="no output from L1 for ${silence_limit}s, its heartbeat included"
		fi
		if [ -n "$broke" ]; then
			sleep 5 # the rest of L1's report
			stop_l1
			break
		fi
		if [ $((SECONDS - started)) -ge "$timeout" ]; then
			timed_out=1
			stop_l1
			break
		fi
		sleep 2
	done
	wait "$qemu_pid" || qemu_rc=$?
	qemu_pid=
	wait "$tail_pid" 2> /dev/null || true
	[ -n "$broke" ] || broke=$(alarm)
	if [ -n "$broke" ] || [ -n "$timed_out" ]; then
		echo "nested-kvm: L1's kernel log ($out/kernel.log) ends:" >&2
		tail -n 40 "$out/kernel.log" >&2
	fi
}

attempt=0
while :; do
	attempt=$((attempt + 1))
	step "booting L1 (QEMU TCG $tcg-threaded, -cpu max, $cpus vCPUs, $mem MiB); output follows"
	boot_l1
	if [ -z "$broke" ] || [ "$attempt" -gt "$retries" ]; then
		break
	fi
	cp "$out/console.log" "$out/console.broken-$attempt.log"
	cp "$out/kernel.log" "$out/kernel.broken-$attempt.log"
	echo "nested-kvm: L1 broke ($broke: the nested host, not the" \
		"commands); booting it again, try $((attempt + 1)) of $((retries + 1))" \
		"(kept: $out/console.broken-$attempt.log, $out/kernel.broken-$attempt.log)" >&2
done
if [ -n "$broke" ]; then
	echo "nested-kvm: L1 broke ($broke): the nested host failed, not" \
		"the commands; see $out/kernel.log and $out/console.log" >&2
	exit 125
fi
if [ -n "$timed_out" ]; then
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
