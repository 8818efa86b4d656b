#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#
# Builds libhcab-rdmav34.so, the rdma-core provider for the hcabench HCA, for
# Debian 12's libibverbs1 (rdma-core 44.0, private ABI IBVERBS_PRIVATE_34):
#
#   guest-user/libhcab/build.sh OUTDIR
#
# No Debian package installs rdma-core's provider API (infiniband/driver.h,
# kern-abi.h, util/, ccan/), so this takes it from the rdma-core 55.0 tree that
# crates.io's ibverbs-sys 0.3.2+55.0 ships (pinned by checksum; private ABI 34
# too), and everything that is public ABI from Debian 12 itself:
#
#   infiniband/verbs.h and friends  libibverbs-dev 44.0 (the guest's own layout)
#   libibverbs.so.1 to link against libibverbs1 44.0 (the symbol versions)
#   driver.h, kern-abi.h, cmd_*.h   rdma-core 55.0 (identical to 44.0 in every
#   util/, ccan/, rdma/*.h          struct and prototype this provider uses; see
#                                   README.md)
#
# Only the provider's own .c files are compiled; nothing of rdma-core is
# configured or built. Downloads are cached in target/libhcab/. Needs curl (or
# cargo), apt-get download (apt lists present: `apt-get update`), dpkg-deb,
# python3, gcc and binutils; root is not needed.
set -euo pipefail

die() { echo "libhcab: error: $*" >&2; exit 1; }
say() { echo "libhcab: $*" >&2; }

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUT=$1
SRC=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$SRC/../.." && pwd)
WORK=$ROOT/target/libhcab
DL=$WORK/dl

CRATE=ibverbs-sys-0.3.2+55.0
CRATE_SHA256=8149ab8d940ea7e7073a24ba6e3ec6b0cc8ceab6ea3d562d60a21ca5cc23413a
CRATE_URL="https://static.crates.io/crates/ibverbs-sys/$CRATE.crate"
PABI=34

for tool in gcc objdump dpkg-deb apt-get python3 tar sha256sum; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool not found (Debian: apt-get install -y gcc binutils dpkg apt python3 tar coreutils)"
done
mkdir -p "$DL" "$OUT"
# One build at a time in target/libhcab (flock is util-linux's, always there).
exec 9>"$WORK/.lock"
flock 9

# --- rdma-core's provider API: the 55.0 tree inside the ibverbs-sys crate ---

crate_ok() { [ -f "$1" ] && echo "$CRATE_SHA256  $1" | sha256sum -c --status; }

fetch_crate() {
	local dst=$DL/$CRATE.crate
	crate_ok "$dst" && return 0
	say "downloading $CRATE.crate from crates.io"
	if command -v curl >/dev/null 2>&1 &&
	   curl -fsSL --retry 3 -o "$dst.part" "$CRATE_URL" && crate_ok "$dst.part"; then
		mv "$dst.part" "$dst"
		return 0
	fi
	rm -f "$dst.part"
	# cargo reaches crates.io through whatever mirror its config names.
	command -v cargo >/dev/null 2>&1 || die "could not download $CRATE_URL (no curl or no network) and cargo is not installed"
	say "curl failed; fetching $CRATE with cargo"
	local proj=$WORK/cargo-fetch
	mkdir -p "$proj/src"
	printf '[workspace]\n\n[package]\nname = "libhcab-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nibverbs-sys = "=0.3.2"\n' >"$proj/Cargo.toml"
	: >"$proj/src/lib.rs"
	cargo fetch -q --manifest-path "$proj/Cargo.toml" >&2 || die "cargo fetch of ibverbs-sys failed"
	local f
	for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$CRATE.crate"; do
		if crate_ok "$f"; then
			cp "$f" "$dst"
			return 0
		fi
	done
	die "cargo fetched no $CRATE.crate with sha256 $CRATE_SHA256"
}

TREE=$WORK/rdma-core-55.0
if [ ! -f "$TREE/.done" ]; then
	fetch_crate
	say "unpacking rdma-core 55.0 headers"
	rm -rf "$TREE" "$WORK/crate"
	mkdir -p "$WORK/crate"
	# Only what a provider compiles against (and the ABI number's source).
	tar -xzf "$DL/$CRATE.crate" -C "$WORK/crate" \
		"$CRATE/vendor/rdma-core/"{CMakeLists.txt,libibverbs,util,ccan,kernel-headers,buildlib}
	mv "$WORK/crate/$CRATE/vendor/rdma-core" "$TREE"
	rm -rf "$WORK/crate"
	grep -q 'set(IBVERBS_PABI_VERSION "'$PABI'")' "$TREE/CMakeLists.txt" ||
		die "the crate's rdma-core is not of private ABI $PABI"
	touch "$TREE/.done"
fi

# --- Debian 12's libibverbs: public headers and the library to link to ---

DEB=$WORK/deb
deb_fetch() {	# package -> the cached .deb of apt's candidate version
	local pkg=$1 ver
	ver=$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')
	[ -n "$ver" ] && [ "$ver" != "(none)" ] ||
		die "apt knows no $pkg: run \`apt-get update\` (a Debian 12 host is needed)"
	case $ver in
	44.*) ;;
	*) die "$pkg's candidate is $ver, not rdma-core 44 (Debian 12's, which the guests run)" ;;
	esac
	local file=$DL/${pkg}_${ver//:/%3a}_amd64.deb
	if [ ! -f "$file" ]; then
		say "downloading $pkg $ver"
		(cd "$DL" && apt-get download -q "$pkg" >&2 2>/dev/null) ||
			(cd "$DL" && apt-get download "$pkg" >&2) ||
			die "apt-get download $pkg failed"
		[ -f "$file" ] || die "apt-get download $pkg produced no $file"
	fi
	echo "$file"
}
DEV_DEB=$(deb_fetch libibverbs-dev)
LIB_DEB=$(deb_fetch libibverbs1)
STAMP="$(basename "$DEV_DEB") $(basename "$LIB_DEB")"
if [ "$(cat "$DEB/.done" 2>/dev/null)" != "$STAMP" ]; then
	rm -rf "$DEB"
	mkdir -p "$DEB"
	dpkg-deb -x "$DEV_DEB" "$DEB"
	dpkg-deb -x "$LIB_DEB" "$DEB"
	echo "$STAMP" >"$DEB/.done"
fi
LIBDIR=$DEB/usr/lib/x86_64-linux-gnu
VERBS=$LIBDIR/libibverbs.so.1
[ -e "$VERBS" ] || die "libibverbs1 has no libibverbs.so.1"
VERBS_SYMS=$(objdump -T "$VERBS")
grep -q "IBVERBS_PRIVATE_$PABI[[:space:]]*verbs_register_driver_$PABI\$" <<<"$VERBS_SYMS" ||
	die "Debian's libibverbs.so.1 does not export verbs_register_driver_$PABI@IBVERBS_PRIVATE_$PABI"

# --- The include tree: public headers of 44, private ones of 55 ---

INC=$WORK/include
say "assembling headers in $INC"
rm -rf "$INC"
mkdir -p "$INC/infiniband" "$INC/rdma" "$INC/kernel-abi"
cp "$DEB"/usr/include/infiniband/*.h "$INC/infiniband/"
for h in driver.h kern-abi.h cmd_ioctl.h cmd_write.h; do
	cp "$TREE/libibverbs/$h" "$INC/infiniband/"
done
cp "$TREE"/kernel-headers/rdma/*.h "$INC/rdma/"
# One copy of the ioctl enums: 44's (verbs_api.h includes it by this name).
cp "$INC/infiniband/ib_user_ioctl_verbs.h" "$INC/rdma/ib_user_ioctl_verbs.h"
python3 "$TREE/buildlib/make_abi_structs.py" "$INC/rdma/ib_user_verbs.h" \
	"$INC/kernel-abi/ib_user_verbs.h"
# What buildlib/config.h.in would say for this build (x86_64, gcc, both
# ioctl and write commands), and nothing that only rdma-core's own tools use.
cat >"$INC/config.h" <<EOF
#ifndef CONFIG_H_IN
#define CONFIG_H_IN
#define HAVE_STATEMENT_EXPR 1
#define HAVE_BUILTIN_TYPES_COMPATIBLE_P 1
#define HAVE_TYPEOF 1
#define HAVE_ISBLANK 1
#define HAVE_BUILTIN_CLZ 1
#define HAVE_BUILTIN_CLZL 1
#define HAVE_FUNC_ATTRIBUTE_ALWAYS_INLINE 1
#define HAVE_FULL_SYMBOL_VERSIONS 1
#define PACKAGE_VERSION "44.0"
#define STREAM_CLOEXEC "e"
#define RDMA_CDEV_DIR "/dev/infiniband"
#define IBVERBS_PABI_VERSION $PABI
#define SIZEOF_LONG 8
#define VERBS_IOCTL_ONLY 0
#define VERBS_WRITE_ONLY 0
#endif
EOF

# --- Compile and link ---

OBJ=$WORK/obj
rm -rf "$OBJ"
mkdir -p "$OBJ"
CFLAGS=(-std=gnu11 -O2 -g -fPIC -pthread -D_GNU_SOURCE
	-Wall -Wextra -Wno-sign-compare -Wno-unused-parameter
	-Wmissing-prototypes -Wstrict-prototypes -Wshadow -Werror
	-I"$INC" -I"$TREE" -I"$ROOT/guest-kmod/include")
for c in "$SRC"/*.c; do
	say "cc $(basename "$c")"
	gcc "${CFLAGS[@]}" -c "$c" -o "$OBJ/$(basename "${c%.c}").o" ||
		die "compiling $(basename "$c") failed"
done
SO=$OUT/libhcab-rdmav$PABI.so
say "linking $SO"
# Exports nothing: the constructor registers the driver at dlopen time.
gcc -shared -pthread -o "$SO.tmp" "$OBJ"/*.o \
	-Wl,--version-script="$SRC/hcab.map" -Wl,--no-undefined \
	-Wl,-z,relro -Wl,-z,now -Wl,--as-needed \
	-L"$LIBDIR" -l:libibverbs.so.1 ||
	die "linking failed"

# --- Check: everything it needs from libibverbs, 44 exports (name@version) ---

exports=$(awk '$2 == "g" && $NF !~ /^\(/ && $(NF-1) ~ /^IBVERBS/ { print $NF "@" $(NF-1) }' <<<"$VERBS_SYMS" | sort -u)
SO_SYMS=$(objdump -T "$SO.tmp")
# objdump writes a needed symbol's version in parentheses, and so a hidden
# (not the default) version of an export: those do not count.
needs=$(awk '/\*UND\*/ { v = $(NF-1); gsub(/[()]/, "", v) } /\*UND\*/ && v ~ /^IBVERBS/ { print $NF "@" v }' <<<"$SO_SYMS" | sort -u)
missing=$(comm -23 <(echo "$needs") <(echo "$exports"))
[ -z "$missing" ] || die "needs symbols Debian's libibverbs 44 lacks: $missing"
grep -qx "verbs_register_driver_$PABI@IBVERBS_PRIVATE_$PABI" <<<"$needs" ||
	die "does not call verbs_register_driver_$PABI@IBVERBS_PRIVATE_$PABI"
unversioned=$(awk '/\*UND\*/ && $(NF-1) !~ /^\(?(IBVERBS|GLIBC)/ && $NF ~ /^(ibv_|verbs_|_verbs|__verbs|__ibv)/ { print $NF }' <<<"$SO_SYMS")
[ -z "$unversioned" ] || die "unversioned libibverbs symbols: $unversioned"

# --- The data path against a simulated kernel and device (tests/sim.c) ---

say "running the data-path simulation (tests/sim.c)"
gcc "${CFLAGS[@]}" -o "$OBJ/sim" "$SRC/tests/sim.c" \
	"$OBJ"/{cq,post,qp,qpex,srq,verbs}.o ||
	die "compiling tests/sim.c failed"
"$OBJ/sim" || die "the data-path simulation failed (tests/sim.c)"

# --- The hostile-process test, run in guests (guest-user/tests/) ---
#
# It reaches into the provider's objects (hcab.h), so it is built against
# exactly this include tree, and links to Debian's libibverbs.so.1 alone.

HOSTILE=$OUT/uverbs-hostile
say "cc uverbs-hostile.c"
gcc "${CFLAGS[@]}" -I"$SRC" -o "$HOSTILE.tmp" \
	"$ROOT/guest-user/tests/uverbs-hostile.c" \
	-Wl,-z,relro -Wl,-z,now -Wl,--as-needed \
	-L"$LIBDIR" -l:libibverbs.so.1 ||
	die "compiling guest-user/tests/uverbs-hostile.c failed"
hostile_needs=$(objdump -T "$HOSTILE.tmp" |
	awk '/\*UND\*/ { v = $(NF-1); gsub(/[()]/, "", v) } /\*UND\*/ && v ~ /^IBVERBS/ { print $NF "@" v }' |
	sort -u)
missing=$(comm -23 <(echo "$hostile_needs") <(echo "$exports"))
[ -z "$missing" ] || die "uverbs-hostile needs symbols Debian's libibverbs 44 lacks: $missing"

mv "$HOSTILE.tmp" "$HOSTILE"
mv "$SO.tmp" "$SO"
say "built $SO ($(echo "$needs" | wc -l) libibverbs symbols, all in Debian's 44.0)"
