#!/usr/bin/env bash
# bash check-plan.sh [-q] PLAN.json SIZE [SIZE...]
# Runs load-plan for every rank of the plan (number of ranks = length of the plan's "gpus" array)
# at every SIZE (per-rank message size as NCCL gives it; suffixes K/M/G accepted).
# Exit 0 only if every (rank, size) is accepted.
# Without -q: one line per (rank, size) and a summary line last (stops at nothing: all are run).
# With -q: exactly one line: the summary if all accepted, else the first failure (stops there).
# Env: LOAD_PLAN (path of the binary), LOAD_PLAN_FLAGS (e.g. --mscclpp-only).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOAD_PLAN=${LOAD_PLAN:-$HERE/load-plan}
QUIET=0
if [ "${1:-}" = "-q" ]; then QUIET=1; shift; fi
if [ $# -lt 2 ]; then
  echo "usage: bash check-plan.sh [-q] PLAN.json SIZE [SIZE...]" >&2
  exit 2
fi
PLAN=$1; shift
[ -x "$LOAD_PLAN" ] || { echo "check-plan: $LOAD_PLAN not built (run build.sh)" >&2; exit 2; }
NRANKS=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$PLAN" 2>/dev/null)
if [ -z "$NRANKS" ] || [ "$NRANKS" -le 0 ] 2>/dev/null; then
  echo "FAIL $PLAN: cannot read a non-empty \"gpus\" array with python3/json"
  exit 1
fi
total=0; bad=0; first=""
for size in "$@"; do
  for ((r = 0; r < NRANKS; r++)); do
    total=$((total + 1))
    if msg=$("$LOAD_PLAN" ${LOAD_PLAN_FLAGS:-} "$PLAN" "$r" "$size" 2>&1 >/dev/null); then
      [ $QUIET = 1 ] || echo "ok      rank=$r size=$size"
    else
      rc=$?
      bad=$((bad + 1))
      line=$(printf '%s' "$msg" | tr '\n' ' ')
      [ -n "$first" ] || first="FAIL $PLAN size=$size exit=$rc: $line"
      if [ $QUIET = 1 ]; then echo "$first"; exit 1; fi
      echo "REFUSED rank=$r size=$size exit=$rc: $line"
    fi
  done
done
if [ $bad -eq 0 ]; then
  echo "OK $PLAN: accepted by MSCCL++ loader for all $NRANKS ranks x $# size(s) ($total checks): $*"
  exit 0
fi
echo "FAIL $PLAN: $bad of $total (rank, size) checks refused; first: ${first#FAIL $PLAN }"
exit 1
