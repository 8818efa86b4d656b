#!/bin/sh
# Runs inside the nested KVM host (ci/nested-kvm.sh ci/nested-check.sh): hcabench's own
# VMM boots Debian's kernel to userspace on a real KVM, with the clock and devices Linux
# needs from a KVM VMM, and the HCA works, `hcabench exec` reaches it, and the shared
# userland disk (the VMM's virtio-mmio block device) lies under /usr with python3, pyverbs
# and iproute2 running from it; then two VMs in one VMM process run a DSM application,
# verified, and ibv_rc_pingpong between processes in them, and `bench vmm` (needs --with-qemu) pings between two VMs with data checked,
# beside QEMU/KVM. Each check prints "ok" or "FAILED"; the last line counts them. With
# NESTED_BOOT_ONLY=1 set before it (CI's second kernel), only the one-node boot.
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
# Runs a command in its own session with its output in LOG, shown here as it comes, and
# gives up on it after LIMIT seconds: SIGTERM to its session, SIGKILL 10 s later, and
# should it still not be gone 30 s after that (a thread stuck in L1's kernel: the nested
# host, which ci/nested-kvm.sh also sees), says where its threads wait and leaves it, so
# that the checks after it still run and report. Returns the command's status, or 124.
limited() {
	limit=$1
	log=$2
	shift 2
	: > "$log"
	setsid "$@" > "$log" 2>&1 &
	pid=$!
	shown=0
	waited=0
	while running "$pid"; do
		show_new "$log"
		if [ "$waited" -ge "$limit" ]; then
			echo "no result from \"$*\" in $limit s; the guests' consoles end:"
			consoles
			kill -TERM -- "-$pid" 2> /dev/null
			gone_within 10 "$pid" || kill -KILL -- "-$pid" 2> /dev/null
			if ! gone_within 30 "$pid"; then
				echo "\"$*\" (pid $pid) would not die; its threads wait in:"
				for t in /proc/"$pid"/task/*; do
					echo "  $(cat "$t/comm" 2> /dev/null): $(cat "$t/wchan" 2> /dev/null)"
				done
				return 124
			fi
			wait "$pid"
			show_new "$log"
			return 124
		fi
		sleep 1
		waited=$((waited + 1))
	done
	wait "$pid"
	rc=$?
	show_new "$log"
	return "$rc"
}
# Whether process $1 still runs (a zombie has ended; it waits only to be reaped).
running() {
	[ -r "/proc/$1/stat" ] || return 1
	[ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]
}
gone_within() {
	n=0
	while running "$2"; do
		[ "$n" -ge "$1" ] && return 1
		sleep 1
		n=$((n + 1))
	done
}
# Prints the lines of $1 that were not shown yet.
show_new() {
	total=$(wc -l < "$1")
	if [ "$total" -gt "$shown" ]; then
		sed -n "$((shown + 1)),${total}p" "$1"
		shown=$total
	fi
}
consoles() {
	for c in /run/hcabench/*.console /tmp/hcabench-*/*.console; do
		[ -f "$c" ] || continue
		echo "--- $c"
		tail -n 20 "$c"
	done
}

t0=$(cut -d' ' -f1 /proc/uptime)
if limited 480 /tmp/up.log hcabench up --nodes 1 --backend kvm --timeout 420; then
	echo "ok: hcabench up --backend kvm (1 node) in $(elapsed "$t0") s"
	pass=$((pass + 1))
else
	echo "FAILED: hcabench up --backend kvm (1 node)"
	fail=$((fail + 1))
fi
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
# `hcabench exec` over the VMM's second UART (COM2, ttyS1 in the guest).
limited 90 /tmp/exec.log hcabench exec node1 -- 'cat /sys/class/infiniband/hcab0/ports/1/state'
check "hcabench exec runs a command in the VMM's guest over COM2" "4: ACTIVE" /tmp/exec.log
# The shared userland disk: the VMM's read-only virtio-mmio block device, which init's
# userland-up lays under /usr; programs on it run.
check "the VMM's guest lays the userland disk under /usr at boot" "HCABENCH-USERLAND /usr from" "$c"
limited 90 /tmp/userland.log hcabench exec node1 -- 'grep " /usr overlay " /proc/mounts;
	for b in /sys/block/vd*; do echo "disk ${b#/sys/block/} serial=$(cat "$b/serial")"; done;
	/usr/bin/python3 -c "import pyverbs.device as d; print(\"pyverbs-devices\", [str(x.name) for x in d.get_device_list()])";
	/usr/bin/ip -V'
check "the userland disk is a virtio disk with its serial" "serial=hcab-userland" /tmp/userland.log
check "/usr is the overlay over the disk" "^overlay /usr overlay " /tmp/userland.log
check "python3 from the disk runs pyverbs, which finds hcab0" "pyverbs-devices .*hcab0" /tmp/userland.log
check "iproute2 from the disk runs" "ip utility, iproute2" /tmp/userland.log
hcabench down > /dev/null
if [ "${NESTED_BOOT_ONLY:-}" = 1 ]; then
	echo "nested: $pass passed, $fail failed"
	[ "$fail" = 0 ]
	exit
fi

# Two VMs in one VMM process. ci/nested-kvm.sh runs this script on L1's CPU 0 alone
# (without that, this nested host now and then corrupts or wedges L1: see its --help).
t0=$(cut -d' ' -f1 /proc/uptime)
limited 360 /tmp/sor.log hcabench run sor --nodes 2 --backend kvm --timeout 240
echo "(run sor took $(elapsed "$t0") s)"
check "both VMs of one VMM process open the DSM on hcab0 and connect" \
	"DSM open on hcab0 on every node, RC mesh connected" /tmp/sor.log
check "SOR on 2 VMs in one VMM process, verified" "verified against a sequential run" /tmp/sor.log

# User-level verbs under the VMM: a process in each of two VMs posts and polls through its
# own UAR page (ibv_rc_pingpong, its buffers checked), the two exchanging addresses over IPoIB.
t0=$(cut -d' ' -f1 /proc/uptime)
limited 300 /tmp/up2.log hcabench up --nodes 2 --backend kvm --timeout 240
limited 60 /tmp/ib0.log hcabench exec node1 -- 'ipoib-up 10.78.0.1/24'
limited 60 /tmp/ib0.log hcabench exec node2 -- 'ipoib-up 10.78.0.2/24'
limited 60 /tmp/pp-srv.log hcabench exec node1 -- '(timeout -s KILL 90 ibv_rc_pingpong -d hcab0 -c -n 200 > /tmp/pp.log 2>&1 &)
	for i in $(seq 100); do netstat -ltn | grep -q ":18515 " && break; sleep 0.1; done'
limited 120 /tmp/pp-cli.log hcabench exec node2 -- 'timeout -s KILL 90 ibv_rc_pingpong -d hcab0 -c -n 200 10.78.0.1'
limited 60 /tmp/pp-srv.log hcabench exec node1 -- 'sleep 1; cat /tmp/pp.log'
echo "(user verbs on 2 VMs took $(elapsed "$t0") s)"
check "ibv_rc_pingpong's client in a VM: 200 checked round trips over hcab0" "200 iters in" /tmp/pp-cli.log
check "ibv_rc_pingpong's server in the other VM: the same" "200 iters in" /tmp/pp-srv.log
hcabench down > /dev/null

if command -v qemu-system-x86_64 > /dev/null; then
	t0=$(cut -d' ' -f1 /proc/uptime)
	if limited 400 /tmp/bench.log hcabench bench vmm --iters 100 --sizes 8,4096; then
		echo "ok: bench vmm (verified ping-pong between 2 VMs, then 2 QEMU/KVM guests)"
		pass=$((pass + 1))
	else
		echo "FAILED: bench vmm"
		fail=$((fail + 1))
	fi
	echo "(bench vmm took $(elapsed "$t0") s)"
else
	echo "FAILED: bench vmm needs QEMU in L1 (ci/nested-kvm.sh --with-qemu)"
	fail=$((fail + 1))
fi

echo "nested: $pass passed, $fail failed"
[ "$fail" = 0 ]
