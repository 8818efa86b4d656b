#!/bin/sh
# Runs inside the nested KVM host (ci/nested-kvm.sh ci/nested-check.sh): hcabench's own
# VMM boots Debian's kernel to userspace on a real KVM, with the clock and devices Linux
# needs from a KVM VMM, and the HCA works; then two VMs in one VMM process run a DSM
# application, verified, and `bench vmm` (needs --with-qemu) pings between two VMs with
# data checked, beside QEMU/KVM. Each check prints "ok" or "FAILED"; the last line counts
# them.
pass=0
fail=0
check() {
	if grep -q -- "$2" "$3"; then
		echo "ok: $1"
		pass=$((pass + 1))
	else
		echo "FAILED: $1 (no \"$2\" in $3)"
		fail=$((fail + 1))
	fi
}
elapsed() { awk "BEGIN { printf \"%.1f\", $(cut -d' ' -f1 /proc/uptime) - $1 }"; }
# A command that gives no result within its limit fails here, with the ends of the
# guests' consoles, rather than running L1 out of time with nothing said.
limited() {
	limit=$1
	shift
	timeout "$limit" "$@"
	rc=$?
	# 124 from coreutils' timeout, 143 (SIGTERM) from busybox's.
	if [ "$rc" = 124 ] || [ "$rc" = 143 ]; then
		echo "no result from \"$*\" in $limit s; the guests' consoles end:"
		for c in /run/hcabench/*.console; do
			[ -f "$c" ] || continue
			echo "--- $c"
			tail -n 20 "$c"
		done
	fi
	return "$rc"
}

t0=$(cut -d' ' -f1 /proc/uptime)
if hcabench up --nodes 1 --backend kvm --timeout 420 > /tmp/up.log 2>&1; then
	echo "ok: hcabench up --backend kvm (1 node) in $(elapsed "$t0") s"
	pass=$((pass + 1))
else
	echo "FAILED: hcabench up --backend kvm (1 node)"
	fail=$((fail + 1))
fi
cat /tmp/up.log
c=/run/hcabench/node1.console
grep -E 'Hypervisor detected|clocksource: Switched|TSC deadline|tsc: Detected|rtc_cmos|Run /init|HCABENCH-(PROBE doorbell|IB|READY)' "$c"
check "Linux finds KVM's paravirtual CPUID leaves" "Hypervisor detected: KVM" "$c"
check "kvm-clock is the clocksource" "Switched to clocksource kvm-clock" "$c"
check "the LAPIC timer runs in TSC-deadline mode" "TSC deadline timer available" "$c"
check "the CMOS RTC sets the wall clock" "rtc_cmos rtc_cmos: setting system clock to 20" "$c"
check "userspace starts" "HCABENCH-INIT node=node1" "$c"
check "hca_ib registers hcab0, port ACTIVE" "HCABENCH-IB hcab0 lid=0x1 state=ACTIVE" "$c"
check "node1's GUID is its LID's, as under QEMU" "guid=0002:c903:0000:0001" "$c"
check "doorbell ioeventfd -> MSI-X irqfd round trips" "HCABENCH-PROBE doorbell-irq rounds=200" "$c"
hcabench down > /dev/null

# Two VMs in one VMM process. ci/nested-kvm.sh runs this script on L1's CPU 0 alone
# (without that, this nested host now and then corrupts or wedges L1: see its --help).
t0=$(cut -d' ' -f1 /proc/uptime)
limited 360 hcabench run sor --nodes 2 --backend kvm --timeout 240 > /tmp/sor.log 2>&1
cat /tmp/sor.log
echo "(run sor took $(elapsed "$t0") s)"
check "both VMs of one VMM process open the DSM on hcab0 and connect" \
	"DSM open on hcab0 on every node, RC mesh connected" /tmp/sor.log
check "SOR on 2 VMs in one VMM process, verified" "verified against a sequential run" /tmp/sor.log

if command -v qemu-system-x86_64 > /dev/null; then
	t0=$(cut -d' ' -f1 /proc/uptime)
	if limited 400 hcabench bench vmm --iters 100 --sizes 8,4096 > /tmp/bench.log 2>&1; then
		echo "ok: bench vmm (verified ping-pong between 2 VMs, then 2 QEMU/KVM guests)"
		pass=$((pass + 1))
	else
		echo "FAILED: bench vmm"
		fail=$((fail + 1))
	fi
	cat /tmp/bench.log
	echo "(bench vmm took $(elapsed "$t0") s)"
else
	echo "FAILED: bench vmm needs QEMU in L1 (ci/nested-kvm.sh --with-qemu)"
	fail=$((fail + 1))
fi

echo "nested: $pass passed, $fail failed"
[ "$fail" = 0 ]
