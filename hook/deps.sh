#!/usr/bin/env bash
# What the hook's build and tests need on a fresh Debian machine, installed idempotently.
#
# * gcc and make (Debian packages, when missing).
# * The real ROCm headers of current Debian stable (trixie, ROCm 5.7): libamdhip64-dev and
#   libhsa-runtime-dev are downloaded with apt-get through a temporary sources list and state
#   folder under $CACHE (the machine's own apt sources are never changed) and unpacked there with
#   dpkg-deb -x. The stub runtime is compiled against them.
# * With --real-runtime: Debian's REAL HIP runtime for the host's own release (bookworm:
#   libamdhip64-5, ROCm 5.2.3), installed with apt-get so the tests can load the hook beside it. trixie's runtime needs a newer
#   glibc than bookworm has, so the real runtime comes from the host's release.
#
# Prints the headers' include folder on stdout (the Makefile passes it to the compiler).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${ROCSHARE_HOOK_CACHE:-$here/../.cache/hook-deps}"
SUITE="${ROCSHARE_HOOK_SUITE:-trixie}"
HEADER_PKGS=(libamdhip64-dev libhsa-runtime-dev)
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
root="$CACHE/$SUITE/root"

log() { echo "hook/deps.sh: $*" >&2; }

apt_install() {  # apt_install PKG... : install missing Debian packages of the host's release
	local missing=()
	for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
}

fetch_headers() {  # the trixie header packages, unpacked into $root (cached by a stamp)
	[ -f "$root/.stamp" ] && return 0
	local state="$CACHE/$SUITE/apt" debs="$CACHE/$SUITE/debs"
	mkdir -p "$state/lists/partial" "$state/archives/partial" "$debs" "$root"
	echo "deb http://deb.debian.org/debian $SUITE main" >"$state/sources.list"
	local opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
		-o "Dir::State::Lists=$state/lists" -o "Dir::Cache::Archives=$state/archives"
		-o "Dir::Cache::pkgcache=$state/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$state/srcpkgcache.bin"
		-o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
	log "fetching ${HEADER_PKGS[*]} from Debian $SUITE into $CACHE"
	apt-get "${opts[@]}" update -qq >&2
	(cd "$debs" && apt-get "${opts[@]}" download "${HEADER_PKGS[@]}" >&2)
	for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
	touch "$root/.stamp"
}

command -v gcc >/dev/null && command -v make >/dev/null || apt_install gcc make libc6-dev
fetch_headers
if [ "${1:-}" = --real-runtime ]; then apt_install libamdhip64-5; fi
echo "$root/usr/include"
