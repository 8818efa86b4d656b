#!/bin/busybox sh
# Init of the nested KVM host (L1, see images/nested.py): loads Debian's kvm_amd, checks
# that /dev/kvm is there, runs /job.sh and powers off. Lines for ci/nested-kvm.sh start
# with "NESTED-". L1's kernel writes to ttyS1 (console=ttyS1); this init and the commands
# write to ttyS0, so that an alarm of L1's own kernel is never confused with an L2 guest's
# console that the commands print.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run
/bin/busybox --install -s /bin
export PATH=/opt/hcabench/bin:/usr/bin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec > /dev/ttyS0 2>&1
mount -t tmpfs tmpfs /run
export XDG_RUNTIME_DIR=/run
# Loopback, as any host has it: the guests' Ethernet segment is UDP on 127.0.0.1.
ip link set lo up
# Errors and alarms only on L1's console (ttyS1): a blocked task is reported as an error.
dmesg -n 4
kver=$(uname -r)
echo "NESTED-INIT kernel=$kver cpus=$(grep -c ^processor /proc/cpuinfo) svm=$(grep -c -w svm /proc/cpuinfo) npt=$(grep -c -w npt /proc/cpuinfo) uptime=$(cut -d' ' -f1 /proc/uptime)"
while read -r m; do
	insmod "/lib/modules/$kver/$m" || echo "NESTED-ERROR insmod $m"
done < "/lib/modules/$kver/kvm-order"
dmesg | grep -i -E 'kvm|svm' | sed 's/^/NESTED-DMESG /'
if [ ! -c /dev/kvm ]; then
	echo "NESTED-ERROR no /dev/kvm after loading kvm_amd"
	echo "NESTED-EXIT 2"
	poweroff -f
fi
# A task blocked in L1's kernel for a minute is reported on ttyS1 (a nested host fault:
# ci/nested-kvm.sh watches for it), and a line every 20 s says L1 still runs: a wedged L1
# prints nothing at all, and ci/nested-kvm.sh stops it instead of waiting out its limit.
echo 60 > /proc/sys/kernel/hung_task_timeout_secs
(while sleep 20; do echo "NESTED-ALIVE uptime=$(cut -d' ' -f1 /proc/uptime)"; done) &
cd /opt/hcabench
echo "NESTED-JOB start uptime=$(cut -d' ' -f1 /proc/uptime)"
sh /job.sh
echo "NESTED-EXIT $?"
poweroff -f
