#!/usr/bin/env bash
# Package init cost of a Go binary's start-up, summed per module.
#
#   hack/inittrace.sh [-n RUNS] [-m MAIN] BINARY [ARGS...]     (ARGS default: version)
#
# Runs BINARY ARGS once to warm the page cache, then RUNS times (default 5) with
# GODEBUG=inittrace=1, and prints per module its init clock (ms: the least over the runs,
# which is the least disturbed by other work, and the mean) and the heap its inits allocate
# (KiB per run), heaviest first. Packages are mapped to their module with go list -deps of
# MAIN (default ./cmd/upgradeguard, run from the repository root); a package it does not
# list (another binary's, e.g. kubectl's) is grouped by its path: std, or
# host/owner/name (github.com, golang.org) or host/name (others), plus a /vN suffix.
set -euo pipefail
runs=5 main=./cmd/upgradeguard
while getopts n:m: o; do case $o in n) runs=$OPTARG ;; m) main=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-n RUNS] [-m MAIN] BINARY [ARGS...]" >&2; exit 2; }
bin=$1; shift
[ $# -gt 0 ] || set -- version
map=$(mktemp); trap 'rm -f "$map"' EXIT
go list -deps -f '{{.ImportPath}} {{with .Module}}{{.Path}}{{else}}std{{end}}' "$main" >"$map"
"$bin" "$@" >/dev/null 2>&1 || true
for _ in $(seq "$runs"); do GODEBUG=inittrace=1 "$bin" "$@" 2>&1 >/dev/null | grep '^init ' || true; echo end; done |
awk -v runs="$runs" '
function module(p,   e, n, k, m) {
	if (p in mod) return mod[p]
	n = split(p, e, "/")
	if (e[1] !~ /\./) return "std"
	k = (e[1] == "github.com" || e[1] == "golang.org") ? 3 : 2
	m = e[1]; for (i = 2; i <= k && i <= n; i++) m = m "/" e[i]
	if (n > k && e[k+1] ~ /^v[0-9]+$/) m = m "/" e[k+1]
	return m
}
NR == FNR { mod[$1] = $2; next }
# init PKG @T ms, X ms clock, B bytes, N allocs
$1 == "end" {	# a run is over: keep the least clock of each module over the runs
	main += last; if (!r++ || last < mainmin) mainmin = last
	for (m in cur) { if (r == 1 || cur[m] < mn[m]) mn[m] = cur[m]; delete cur[m] }
	if (r == 1 || rt < totmin) totmin = rt; rt = 0; next }
{ m = module($2); ms[m] += $5; cur[m] += $5; rt += $5; kb[m] += $8 / 1024; tot += $5; tkb += $8 / 1024
  if (!((m, $2) in seen)) { seen[m, $2]; np[m]++ }
  last = substr($3, 2) + $5 }
END {
	printf "%-44s %5s %7s %7s %6s %8s\n", "module", "pkgs", "ms min", "ms mean", "share", "KiB/run"
	for (m in ms)
		printf "%-44s %5d %7.2f %7.2f %5.1f%% %8.0f\n", m, np[m], mn[m], ms[m] / runs, 100 * ms[m] / tot, kb[m] / runs | "sort -k3 -rn"
	close("sort -k3 -rn")
	printf "%-44s %5s %7.2f %7.2f %6s %8.0f\n", "total", "", totmin, tot / runs, "", tkb / runs
	printf "last init ends %.1f ms (least) %.1f ms (mean) after the runtime starts; %d runs\n", mainmin, main / runs, runs
}' "$map" -
