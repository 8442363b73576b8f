#!/bin/sh
# check-glibc-floor.sh LIBRARY [FLOOR]: fail unless the built hook loads under every glibc from
# FLOOR on (default: hook/GLIBC_FLOOR, the one place the floor is stated). An audit library that
# needs a newer symbol version is refused by the loader ("cannot be loaded as audit interface")
# and the container then runs with no limit, so the build refuses to produce one. Checked:
# - every GLIBC_x[.y[.z]] version the library needs (readelf -V) is at most FLOOR;
# - it needs no library but libc.so.6 (no libasan, libm, ld.so private versions);
# - it imports no fortify (__*_chk), stack-protector or C23-redirected (__isoc23_*) symbol:
#   those mean the compiler flags no longer hold what hook/Makefile asks of them.
set -eu
lib=$1
floor=${2:-$(cat "$(dirname "$0")/GLIBC_FLOOR")}
say() { echo "check-glibc-floor: $lib: $*" >&2; }
needs=$(readelf -V -W "$lib" | sed -n 's/.*Name: \(GLIBC_[0-9A-Z_.]*\).*/\1/p' | sort -u)
[ -n "$needs" ] || { say "readelf -V shows no GLIBC version need (output format changed?)"; exit 1; }
bad=$(echo "$needs" | awk -v floor="$floor" '
	function newer(v, f,   a, b, n, i) {  # 1 if dotted version v > f
		n = split(v, a, "."); split(f, b, ".")
		for (i = 1; i <= (n > 3 ? n : 3); i++) { if (a[i] + 0 > b[i] + 0) return 1; if (a[i] + 0 < b[i] + 0) return 0 }
		return 0
	}
	{ v = $0; sub(/^GLIBC_/, "", v); if (v !~ /^[0-9.]+$/ || newer(v, floor)) print $0 }')
[ -z "$bad" ] || { say "needs $(echo $bad) above the floor GLIBC_$floor: $(readelf --dyn-syms -W "$lib" | grep -E "@($(echo $bad | tr ' ' '|'))( |$)" | awk '{print $8}' | tr '\n' ' ')"; exit 1; }
libs=$(readelf -d -W "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
[ "$libs" = "libc.so.6 " ] || { say "needs libraries [$libs], only libc.so.6 allowed"; exit 1; }
odd=$(readelf --dyn-syms -W "$lib" | awk '$7 == "UND" {print $8}' | grep -E '^(__.*_chk|__stack_chk_|__isoc23_)' || true)
[ -z "$odd" ] || { say "imports $(echo $odd): fortify/stack-protector/C23 symbols the Makefile's flags exclude"; exit 1; }
echo "check-glibc-floor: $lib needs $(echo $needs) (floor GLIBC_$floor): ok"
