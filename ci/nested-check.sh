#!/bin/sh
# Runs inside the nested KVM host (ci/nested-kvm.sh ci/nested-check.sh): hcabench's own
# VMM boots Debian's kernel to userspace on a real KVM, with the clock and devices Linux
# needs from a KVM VMM, and the HCA works, `hcabench exec` reaches it, and the shared
# userland disk (the VMM's virtio-mmio block device) lies under /usr with python3, pyverbs
# and iproute2 running from it; then two VMs in one VMM process run a DSM application,
# verified, and between processes in them ibv_rc_pingpong, rping (its pattern checked) and
# perftest's ib_send_lat and ib_write_bw (their result rows checked), then over the VMs'
# NICs (the VMM's virtio-net, on the cluster's Ethernet segment) a ping and SoftRoCE's
# ibv_rc_pingpong, and `bench vmm`
# (needs --with-qemu) pings between two VMs with data checked, beside QEMU/KVM. Each check
# prints "ok" or "FAILED"; the last line counts them. With NESTED_BOOT_ONLY=1 set before
# it (CI's second kernel), only the one-node boot.
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
# Counts a check by what is wrong: ok when $2 is empty, else FAILED and $2.
judge() {
	if [ -z "$2" ]; then
		echo "ok: $1"
		pass=$((pass + 1))
	else
		echo "FAILED: $1 ($2)"
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
# Runs SERVER in node1 in the background and CLIENT in node2 once READY (a command in
# node1) succeeds, or 10 s on; each under `timeout -s KILL 90`, their output and then
# "EXIT <status>" in /tmp/NAME-srv.log and /tmp/NAME-cli.log here. A server still running
# 30 s after its client ended is killed ("EXIT hung").
serve() {
	name=$1
	ready=$2
	server=$3
	client=$4
	limited 60 "/tmp/$name-start.log" hcabench exec node1 -- "rm -f /tmp/srv.log
	(timeout -s KILL 90 $server > /tmp/srv.log 2>&1; echo \"EXIT \$?\" >> /tmp/srv.log) > /dev/null 2>&1 &
	for i in \$(seq 100); do $ready && break; sleep 0.1; done"
	limited 120 "/tmp/$name-cli.log" hcabench exec --timeout 100 node2 -- \
		"timeout -s KILL 90 $client 2>&1; echo \"EXIT \$?\""
	limited 60 "/tmp/$name-srv.log" hcabench exec node1 -- "for i in \$(seq 300); do
		grep -q ^EXIT /tmp/srv.log && break; sleep 0.1; done
	grep -q ^EXIT /tmp/srv.log || { killall -q -9 ${server%% *}; echo 'EXIT hung'; }
	cat /tmp/srv.log"
}
# A perftest run between the VMs (CMD served in node1, CMD 10.78.0.1 in node2), its logs
# /tmp/NAME-*.log. One whose clock calibration failed (perftest times with the TSC and
# gives no report when it and the wall clock disagree) says nothing of RDMA: again, twice
# at most.
run_perftest() {
	for try in 1 2 3; do
		serve "$1" "netstat -ltn | grep -q ':18515 '" "$2" "$2 10.78.0.1"
		grep -q "Correlation coefficient" "/tmp/$1-srv.log" "/tmp/$1-cli.log" || break
		echo "(perftest's clock calibration failed in a VM, try $try; again)"
	done
}
# What is wrong with the exit statuses of serve's logs NAME: nothing when both are 0.
exits_wrong() {
	s=$(sed -n 's/^EXIT \([0-9a-z]*\).*/\1/p' "/tmp/$1-srv.log" | tr -d '\r' | tail -1)
	c=$(sed -n 's/^EXIT \([0-9a-z]*\).*/\1/p' "/tmp/$1-cli.log" | tr -d '\r' | tail -1)
	[ "$s" = 0 ] && [ "$c" = 0 ] || echo "server exit ${s:-none}, client exit ${c:-none}"
}
# perftest's result row in $1: the first line of numbers under its "#bytes" header.
result_row() {
	tr -d '\r' < "$1" | awk '/^ *#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { $1 = $1; print; exit }'
}
# What is wrong with ib_send_lat's result row $1: nothing when it ran $2 bytes x $3
# iterations and 0 < t_min <= t_typical, t_min <= t_avg <= t_max (its columns: #bytes
# #iterations t_min t_max t_typical t_avg ...).
lat_wrong() {
	echo "$1" | awk -v size="$2" -v n="$3" '
		NF < 6 { print "no result row"; exit }
		$1 != size || $2 != n { print "it ran " $1 " B x " $2 ", not " size " B x " n; exit }
		!($3 > 0 && $3 <= $5 && $3 <= $6 && $6 <= $4) {
			print "t_min " $3 ", t_max " $4 ", t_typical " $5 ", t_avg " $6 " us: out of order" }'
}
# What is wrong with ib_write_bw's result row $1: nothing when it ran $2 bytes x $3
# iterations with a positive average bandwidth no higher than the peak, and a positive
# message rate (its columns: #bytes #iterations peak average MsgRate).
bw_wrong() {
	echo "$1" | awk -v size="$2" -v n="$3" '
		NF < 5 { print "no result row"; exit }
		$1 != size || $2 != n { print "it ran " $1 " B x " $2 ", not " size " B x " n; exit }
		!($4 > 0 && $3 >= $4 && $5 > 0) {
			print "BW peak " $3 ", average " $4 " MB/s, " $5 " Mpps" }'
}
# What is wrong with rping's pings in $1, the lines that start with $2 (the client's
# "ping data: ", the server's "server ping data: "): nothing when there are $3, ping k
# carrying rping's pattern for k in order ("rdma-ping-k: ", then ASCII from 'A' + k mod 58
# on, 'z' wrapping to 'A', up to the 64-byte buffer's last byte, a NUL), and rping saw
# no data mismatch.
rping_wrong() {
	tr -d '\r' < "$1" | awk -v prefix="$2" -v count="$3" 'BEGIN { n = 0 }
		/data mismatch/ { print "rping saw a data mismatch"; bad = 1; exit }
		index($0, prefix) == 1 {
			got = substr($0, length(prefix) + 1)
			want = "rdma-ping-" n ": "
			for (c = 65 + n % 58; length(want) < 63; c = (c >= 122 ? 65 : c + 1))
				want = want sprintf("%c", c)
			if (got != want) {
				print "ping " n " carried \"" got "\", not \"" want "\""
				bad = 1
				exit
			}
			n++
		}
		END { if (!bad && n != count) print n " pings of " count }'
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
# The VMs have NICs on the cluster's Ethernet segment too (checked after perftest).
t0=$(cut -d' ' -f1 /proc/uptime)
echo "ethernet = true" > /tmp/eth.toml
limited 300 /tmp/up2.log hcabench up --config /tmp/eth.toml --nodes 2 --backend kvm --timeout 240
limited 60 /tmp/ib0.log hcabench exec node1 -- 'ipoib-up 10.78.0.1/24'
limited 60 /tmp/ib0.log hcabench exec node2 -- 'ipoib-up 10.78.0.2/24'
limited 60 /tmp/pp-srv.log hcabench exec node1 -- '(timeout -s KILL 90 ibv_rc_pingpong -d hcab0 -c -n 200 > /tmp/pp.log 2>&1 &)
	for i in $(seq 100); do netstat -ltn | grep -q ":18515 " && break; sleep 0.1; done'
limited 120 /tmp/pp-cli.log hcabench exec node2 -- 'timeout -s KILL 90 ibv_rc_pingpong -d hcab0 -c -n 200 10.78.0.1'
limited 60 /tmp/pp-srv.log hcabench exec node1 -- 'sleep 1; cat /tmp/pp.log'
echo "(user verbs on 2 VMs took $(elapsed "$t0") s)"
check "ibv_rc_pingpong's client in a VM: 200 checked round trips over hcab0" "200 iters in" /tmp/pp-cli.log
check "ibv_rc_pingpong's server in the other VM: the same" "200 iters in" /tmp/pp-srv.log
# The same VMs: rdma_cm and perftest. rping's client checks each ping with -V and both
# ends print its data (-v), which must be rping's pattern; perftest's result rows must
# say what they ran, with times and bandwidth measured.
t0=$(cut -d' ' -f1 /proc/uptime)
serve rping "rdma resource show cm_id 2> /dev/null | grep -q LISTEN" \
	"rping -s -a 10.78.0.1 -v -C 20" "rping -c -a 10.78.0.1 -v -V -C 20"
judge "rping over rdma_cm between the VMs: both ends exit 0" "$(exits_wrong rping)"
judge "rping's client: 20 pings, each with its pattern" \
	"$(rping_wrong /tmp/rping-cli.log "ping data: " 20)"
judge "rping's server: the same 20" "$(rping_wrong /tmp/rping-srv.log "server ping data: " 20)"
run_perftest lat "ib_send_lat -d hcab0 -s 8 -n 1000"
row=$(result_row /tmp/lat-cli.log)
echo "(ib_send_lat's row: ${row:-none})"
judge "ib_send_lat between the VMs: both ends exit 0" "$(exits_wrong lat)"
judge "ib_send_lat: 1000 8-byte sends, latencies measured and in order" \
	"$(lat_wrong "$row" 8 1000)"
run_perftest bw "ib_write_bw -d hcab0 -s 65536 -n 300"
row=$(result_row /tmp/bw-cli.log)
echo "(ib_write_bw's row: ${row:-none})"
judge "ib_write_bw between the VMs: both ends exit 0" "$(exits_wrong bw)"
judge "ib_write_bw: 300 64 KiB RDMA Writes, bandwidth measured" "$(bw_wrong "$row" 65536 300)"
echo "(rping and perftest on 2 VMs took $(elapsed "$t0") s)"
# The same VMs' NICs (the VMM's virtio-net on virtio-mmio, on the cluster's hub): they ping
# each other over eth0, and SoftRoCE on them carries ibv_rc_pingpong's checked round trips.
t0=$(cut -d' ' -f1 /proc/uptime)
limited 90 /tmp/rxe1.log hcabench exec node1 -- 'rxe-up 10.77.0.1/24'
limited 90 /tmp/rxe2.log hcabench exec node2 -- 'rxe-up 10.77.0.2/24'
check "SoftRoCE comes up on node1's NIC" "state ACTIVE" /tmp/rxe1.log
check "SoftRoCE comes up on node2's NIC" "state ACTIVE" /tmp/rxe2.log
limited 60 /tmp/eth-ping.log hcabench exec node2 -- 'ping -c 3 -W 2 10.77.0.1 > /dev/null && echo eth-ping-ok'
check "node2 pings node1 over the VMs' Ethernet segment" "eth-ping-ok" /tmp/eth-ping.log
limited 60 /tmp/rxe-srv.log hcabench exec node1 -- '(timeout -s KILL 90 ibv_rc_pingpong -d rxe0 -g 1 -c -n 100 > /tmp/rxe-pp.log 2>&1 &)
	for i in $(seq 100); do netstat -ltn | grep -q ":18515 " && break; sleep 0.1; done'
limited 120 /tmp/rxe-cli.log hcabench exec node2 -- 'timeout -s KILL 90 ibv_rc_pingpong -d rxe0 -g 1 -c -n 100 10.77.0.1'
limited 60 /tmp/rxe-srv.log hcabench exec node1 -- 'sleep 1; cat /tmp/rxe-pp.log'
check "ibv_rc_pingpong over rxe0 between the VMs: 100 checked round trips" "100 iters in" /tmp/rxe-cli.log
check "ibv_rc_pingpong's server over rxe0: the same" "100 iters in" /tmp/rxe-srv.log
echo "(the VMs' NICs took $(elapsed "$t0") s)"
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
