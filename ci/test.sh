#!/usr/bin/env bash
# The project's test command (README, command 2; .ci/run runs exactly this).
# Installs what a fresh machine lacks, then: format check, clippy, every test, and a short
# benchmark run so that the bench keeps working (its figures are printed, never asserted).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
	step "installing ${need_apt[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing: ${need_apt[*]}; run: sudo apt-get install -y ${need_apt[*]}" >&2
		exit 1
	fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
	echo "cargo not found: install Rust (https://rustup.rs) and re-run" >&2
	exit 1
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
read -r passed failed < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$log")

step "model benchmark (quick run; figures for reading, not asserted)"
cargo bench -p hca-model --bench throughput -- --quick

step "model cluster demo (README command 1), 4 nodes"
cargo run --release -q -p hca-model --example cluster -- --rounds 50

echo
echo "tests: ${passed} passed, ${failed} failed"
