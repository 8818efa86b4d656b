#!/usr/bin/env bash
# README command 1: sets up what is missing, boots a Linux cluster under QEMU with hcabench
# HCAs (each guest prints its init banner, finds its HCA, reads its LID from BAR2 and times
# doorbell -> MSI-X round trips, loads the ib_core provider and the vbench verbs module, and
# brings up Debian's IPoIB on ib0 through the fabric's subnet administrator), shows it and
# the administrator's multicast groups, stops it; runs the paper's SOR on the kernel DSM
# across the guests, verified against a sequential run; runs kernel verbs ping-pong and RDMA
# between two guests over our HCA and over SoftRoCE side by side; then the paper's traffic
# pattern on a 4-node model cluster.
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh

cargo build --release -q -p hcabench -p hca-model --examples --bins
hcabench=target/release/hcabench
run=target/demo-run
trap '"$hcabench" --run-dir "$run" down >/dev/null 2>&1 || true' EXIT

printf '\n==> hcabench up: %s guests under QEMU\n' "${NODES:-2}"
"$hcabench" --run-dir "$run" up --nodes "${NODES:-2}"
printf '\n==> hcabench status\n'
"$hcabench" --run-dir "$run" status
printf '\n==> hcabench fabric: the subnet administrator'"'"'s groups (IPoIB joined on every node)\n'
"$hcabench" --run-dir "$run" fabric
printf '\n==> what the guests printed on their consoles\n'
grep -h '^HCABENCH-' "$run"/node*.console | grep -v 'taints kernel\|verification failed'
printf '\n==> hcabench run probe\n'
"$hcabench" --run-dir "$run" run probe
printf '\n==> hcabench down\n'
"$hcabench" --run-dir "$run" down

printf '\n==> hcabench run sor: the kernel DSM on %s fresh guests, SOR verified\n' "${NODES:-2}"
"$hcabench" run sor --nodes "${NODES:-2}"

printf '\n==> hcabench bench verbs: kernel verbs over the HCA vs SoftRoCE (short run)\n'
"$hcabench" bench verbs --iters 200 --sizes 8,4096 --bw-sizes 65536 --bw-bytes 8388608

printf '\n==> 4-node model cluster: SENDs (one signaled in 16) and 64 KiB RDMA WRITEs, verified\n'
target/release/examples/cluster
