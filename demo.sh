#!/usr/bin/env bash
# README command 1: sets up what is missing, boots a 2-node Linux cluster under QEMU with
# hcabench HCAs (each guest finds its HCA, checks BAR2 and times doorbell -> MSI-X round
# trips), then runs the paper's traffic pattern on a 4-node model-level cluster.
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh

printf '\n==> 2-node QEMU cluster (TCG), guests booting the image just built\n'
cargo run --release -q -p e2e --example boot_time -- "${NODES:-2}"

printf '\n==> 4-node model cluster: SENDs (one signaled in 16) and 64 KiB RDMA WRITEs, verified\n'
cargo run --release -q -p hca-model --example cluster
