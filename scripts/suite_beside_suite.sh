#!/bin/bash
# Does the default suite hold on a busy machine? `make test` N times in a row from a fresh clone
# (A) while a second fresh clone (B) runs `make test` over and over beside it, so every minute of
# A's runs has a whole second suite competing for the same cores. Appends a record to
# bench/results/suite_beside_suite.json (each run's exit status and wall time, the CPU, the load).
#
#   bash scripts/suite_beside_suite.sh [N=5] [WORKDIR=/tmp/suite_beside_suite]
#
# Clones this checkout's HEAD; each clone builds its own .venv (never a symlink to this one's: an
# editable install would be repointed).
set -u
set -m  # background jobs in their own process groups
N=${1:-5}
WORK=${2:-/tmp/suite_beside_suite}
SRC=$(git rev-parse --show-toplevel)
COMMIT=$(git -C "$SRC" rev-parse HEAD)
OUT="$SRC/bench/results/suite_beside_suite.json"
rm -rf "$WORK" && mkdir -p "$WORK"
git clone -q "$SRC" "$WORK/a" && git clone -q "$SRC" "$WORK/b"
# Build both venvs first, so the timed runs are the suite itself.
(cd "$WORK/a" && bash scripts/setup.sh >"$WORK/setup_a.log" 2>&1) || { echo "setup a failed"; exit 1; }
(cd "$WORK/b" && bash scripts/setup.sh >"$WORK/setup_b.log" 2>&1) || { echo "setup b failed"; exit 1; }

# B: make test in a loop until A is done.
touch "$WORK/a.running"
(
  cd "$WORK/b"
  k=0
  while [ -e "$WORK/a.running" ]; do
    k=$((k + 1)); t0=$(date +%s)
    make test >"$WORK/b_$k.log" 2>&1; rc=$?
    echo "$k $rc $(( $(date +%s) - t0 ))" >>"$WORK/b_runs.txt"
  done
) &
BPID=$!  # its own job: killed with its make when A is done (an unfinished B run is not recorded)

: >"$WORK/a_runs.txt"
for i in $(seq 1 "$N"); do
  t0=$(date +%s); load0=$(cut -d' ' -f1 /proc/loadavg)
  (cd "$WORK/a" && make test >"$WORK/a_$i.log" 2>&1); rc=$?
  dt=$(( $(date +%s) - t0 ))
  passed=$(grep -Eo '[0-9]+ passed' "$WORK/a_$i.log" | tail -1 | cut -d' ' -f1)
  echo "$i $rc $dt ${passed:-0} $load0" >>"$WORK/a_runs.txt"
  echo "run $i/$N: rc=$rc ${dt}s passed=${passed:-0} load1=$load0"
  [ "$rc" -eq 0 ] || break
done
rm -f "$WORK/a.running"
# The whole group: the loop, make, pytest and its xdist workers (pytest replaces a worker killed alone).
kill -TERM -- -"$BPID" 2>/dev/null; wait "$BPID" 2>/dev/null

"$SRC/.venv/bin/python" - "$WORK" "$OUT" "$COMMIT" "$N" <<'EOF'
import json, platform, subprocess, sys, datetime
work, out, commit, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def rows(name, keys):
    with open(f"{work}/{name}") as f:
        return [dict(zip(keys, (float(x) if "." in x else int(x) for x in line.split()))) for line in f if line.strip()]
a = rows("a_runs.txt", ["run", "rc", "wall_s", "passed", "load1_at_start"])
b = rows("b_runs.txt", ["run", "rc", "wall_s"])
flags = subprocess.run(["grep", "-m1", "^flags", "/proc/cpuinfo"], capture_output=True, text=True).stdout
model = subprocess.run(["grep", "-m1", "^model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
res = {
    "what": "make test (default suite, pytest -n 2) N times in a row from a fresh clone, with a second "
            "fresh clone running make test in a loop beside it on the same cores",
    "commit": commit, "date": datetime.date.today().isoformat(),
    "cpu": model.split(":", 1)[-1].strip(), "cores": __import__("os").cpu_count(),
    "cpu_flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags],
    "python": platform.python_version(),
    "runs_asked": n, "a_runs": a, "b_runs_beside": b,
    "a_all_passed": len(a) == n and all(r["rc"] == 0 for r in a),
    "b_all_passed": all(r["rc"] == 0 for r in b),
}
import os
old = json.load(open(out)) if os.path.exists(out) else {"records": []}
old["records"].append(res)
with open(out, "w") as f:
    json.dump(old, f, indent=2)
    f.write("\n")
print(json.dumps({k: res[k] for k in ("a_all_passed", "b_all_passed")}), "->", out)
EOF
