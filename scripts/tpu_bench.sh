#!/usr/bin/env bash
# Run benchmarks on an accelerator machine within a wall-clock limit, then copy what they recorded to a folder.
#
#   scripts/tpu_bench.sh DEST SECONDS [python -m bench.cli arguments...]
#   e.g. scripts/tpu_bench.sh /tmp/out 570 --only tpu_ablation --seeds 0..4
#
# Sets the checkout up first (scripts/tpu_setup.sh into $TPU_SITE, default build/tpu-site), then runs the benchmarks
# with --budget-s set to what is left of SECONDS (less a margin for the figures and the copy), under `timeout` so
# that a run that overshoots is stopped and what it recorded is still copied: bench/results.json, BENCHMARKS.md, and
# every file under bench/ the run wrote (ledgers, plots, traces). Logs: DEST/setup.log and DEST/bench.log. Exit
# status: the bench's.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: scripts/tpu_bench.sh DEST SECONDS [bench arguments...]}
total=${2:?usage: scripts/tpu_bench.sh DEST SECONDS [bench arguments...]}
shift 2
mkdir -p "$dest"
stamp=$(mktemp)
setup=$("$root/scripts/tpu_setup.sh" "${TPU_SITE:-$root/build/tpu-site}" 2>"$dest/setup.log") \
  || { tail -30 "$dest/setup.log" >&2; exit 2; }
eval "$setup"
left=$((total - SECONDS))
if ((left < 120)); then echo "tpu_bench: only ${left}s left after the set-up; nothing run" >&2; exit 2; fi
cd "$root"
# The bench plans runs within the budget; the 20 s between it and the kill leave the figures and plots it renders
# after its last run (seconds) room to finish.
timeout --signal=TERM --kill-after=10 $((left - 15)) python3 -m bench.cli --budget-s $((left - 35)) "$@" 2>&1 \
  | tee "$dest/bench.log"
rc=${PIPESTATUS[0]}
cp bench/results.json BENCHMARKS.md "$dest/"
find bench -maxdepth 1 -type f -newer "$stamp" ! -name results.json -exec cp {} "$dest/" \;
rm -f "$stamp"
exit "$rc"
