#!/bin/busybox sh
# hcabench guest init. Node identity and the job come from the kernel command line
# (hcabench.node=NAME hcabench.cmd=CMD); every line meant for the harness starts with
# "HCABENCH-" on the serial console.
/bin/busybox mkdir -p /proc /sys /dev /tmp
# Where daemons from the userland's packages keep state and logs (opensm's
# /var/cache/opensm, ...): the package's postinst, which would make them, never runs here.
/bin/busybox mkdir -p /var/cache /var/lib /var/log /var/tmp /var/run /run
/bin/busybox --install -s /bin
# /usr/bin and /usr/lib: the shared userland disk's (userland-up), where there is one.
export PATH=/bin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# POSIX shared memory (shm_open; Python's multiprocessing, which rdma-core's tests use).
mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm
# The kernel loads modules it asks for (rdma-link-rxe for `rdma link add`, ...) through
# /sbin/modprobe: busybox's, with the image's modules.dep and modules.alias. Made here, not
# in the image: during the kernel's own boot it would only fail to find crypto modules the
# image lacks, slower (~80 ms under TCG) than finding no modprobe.
mkdir -p /sbin && ln -s /bin/busybox /sbin/modprobe
# The root file system (where /tmp lives) is a tmpfs of half the RAM; the image takes a
# good part of that. Files a user moves between guests get most of the RAM instead.
mount -o remount,size=80% / 2>/dev/null

say() { echo "HCABENCH-$*"; }

node=unknown
cmd=shell
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	hcabench.node=*) node=${arg#hcabench.node=} ;;
	hcabench.cmd=*) cmd=${arg#hcabench.cmd=} ;;
	esac
done
kver=$(uname -r)
say "INIT node=$node kernel=$kver uptime=$(cut -d' ' -f1 /proc/uptime)"

# Kernel messages stay in the log, off the console the harness parses.
dmesg -n 1
while read -r m; do
	insmod "/lib/modules/$kver/$m" || say "ERROR insmod $m"
done < "/lib/modules/$kver/load-order"

found=0
for d in /sys/bus/pci/devices/*; do
	id="$(cat "$d/vendor"):$(cat "$d/device")"
	case "$id" in
	0x1af4:0x1110 | 0x1234:0x21a8)
		say "PCI $(basename "$d") $id"
		found=1
		;;
	esac
done
[ "$found" = 1 ] || say "ERROR no HCA on the PCI bus"

# The probe driver checks BAR2, rings doorbells and times their MSI-X round trips; then it
# gives the device to the real driver.
if insmod "/lib/modules/$kver/extra/hca_probe.ko"; then
	dmesg | grep 'hca_probe: ' | sed 's/.*hca_probe: /HCABENCH-PROBE /'
	rmmod hca_probe
else
	say "ERROR hca_probe did not load"
	dmesg | grep 'hca_probe: ' | sed 's/.*hca_probe: /HCABENCH-PROBE /'
fi

# The ib_core provider, then its consumers: the verbs benchmark and the DSM.
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
x=/lib/modules/$kver/extra
if insmod $x/hca_ib.ko && insmod $x/vbench.ko && insmod $x/dsm.ko; then
	for p in /sys/class/infiniband/*/ports/1; do
		[ -e "$p" ] || { say "ERROR no ib_device registered"; break; }
		dev=${p#/sys/class/infiniband/}
		dev=${dev%%/*}
		say "IB $dev lid=$(cat "$p/lid") state=$(cut -d' ' -f2 < "$p/state")" \
			"guid=$(cat "/sys/class/infiniband/$dev/node_guid")"
	done
else
	say "ERROR hca_ib, vbench or dsm did not load"
fi
# A user's cluster (the shell job) has its IP network over the fabric at once: Debian's
# IPoIB on ib0, 10.78.0.0/16, the host part the LID.
if [ "$cmd" = shell ]; then
	lid=$(($(cat /sys/class/infiniband/hcab0/ports/1/lid 2>/dev/null || echo 0)))
	addr=10.78.$((lid / 256)).$((lid % 256))/16
	if ipoib-up "$addr" > /dev/null 2>&1; then
		say "IPOIB ib0 addr=$addr"
	else
		say "ERROR ipoib-up $addr: ib0 got no carrier"
	fi
fi
# A user's cluster has the shared userland (python3, pyverbs, rdma-core's tests) in /usr.
if [ "$cmd" = shell ]; then
	t0=$(cut -d' ' -f1 /proc/uptime)
	if userland-up; then
		[ -x /usr/bin/python3 ] &&
			say "USERLAND /usr from $t0 s to $(cut -d' ' -f1 /proc/uptime) s"
	else
		say "ERROR userland-up failed: no python3 or pyverbs in this guest"
	fi
fi
# `hcabench exec` and `cp` on a user's cluster: a command channel on the second serial port
# (ttyS1, whose host end is the run directory's NODE.agent socket), so that the console
# stays the user's. As the agent job's below: raw (every byte passes as it is; ^C is no
# signal), no echo, and a pipe so that the shell is non-interactive (no prompt, no line
# editing); the host ends each command with a marker line (cluster/src/agent.rs). If a
# command ends the shell, the loop starts another.
if [ "$cmd" = shell ]; then
	if stty -F /dev/ttyS1 raw -echo 2> /dev/null; then
		setsid sh -c 'while true; do cat /dev/ttyS1 | sh > /dev/ttyS1 2>&1; done' \
			< /dev/null > /dev/null 2>&1 &
	else
		say "ERROR no second serial port (ttyS1): hcabench exec and cp cannot reach $node"
	fi
fi
say "READY node=$node uptime=$(cut -d' ' -f1 /proc/uptime)"

case "$cmd" in
poweroff) poweroff -f ;;
agent)
	# A command channel for the harness: no echo, no prompt, no line editing (a pipe
	# makes the shell non-interactive). Every command's output ends in a marker line.
	stty -echo 2>/dev/null
	say "AGENT"
	while true; do cat | sh; done
	;;
*) exec setsid cttyhack sh ;;
esac
