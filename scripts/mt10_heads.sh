#!/usr/bin/env bash
# Issue #67: every action head on Meta-World MT10 with the fair protocol, on the recipe the table
# chose for the flow head (mt10.vlastack_hindsight: grounding on `vla data hindsight` labels, no
# simulator labels, fp32), only the head changed. Each head trains the flow row's 12,000 steps
# scaled by its measured step cost (bench/results/mt10_step_costs_hindsight_fp32.json).
#
#   bash scripts/mt10_heads.sh train HEAD            # runs/mt10_HEAD (resumes; one thread: two heads fit 2 cores)
#   bash scripts/mt10_heads.sh validate HEAD "WHAT"  # validation seeds -> mt10.tuning.vlastack_hindsight_HEAD
#   bash scripts/mt10_heads.sh test HEAD SEED N      # test seeds SEED..SEED+N-1 per task (a resumable shard)
#   bash scripts/mt10_heads.sh merge HEAD            # the shards -> runs/mt10_HEAD/eval/eval.json, then the row
#
# HEAD: a head of the costs file (oft, fast, bins_parallel_l1, bins_ar_h1). Needs data/mt10_hindsight (docs/metaworld.md). A
# head kept in bench/results/policies/mt10_HEAD is restored as a run with
# `cp -r bench/results/policies/mt10_HEAD runs/`; its shards are in its eval_test/ folder.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=${MUJOCO_GL:-egl}
PY=${PY:-.venv/bin/python}
cmd=$1
H=$2
RUN=runs/mt10_$H
# Each head's overrides (its built-in-suite recipe on the hindsight recipe) and its step budget, as
# bench/mt10_heads_timing.py measured and wrote them: one list of heads, one set of budgets.
COSTS=bench/results/mt10_step_costs_hindsight_fp32.json
OVR=$("$PY" - "$COSTS" "$H" <<'PY'  # an assignment, so that set -e stops on an unknown head
import json, sys
d, h = json.load(open(sys.argv[1])), sys.argv[2]
if h not in d["budget_steps"]:
    sys.exit(f"unknown head {h!r}: {sys.argv[1]} has {', '.join(d['budget_steps'])}")
print("\n".join([*d["overrides"][h], f"train.steps={d['budget_steps'][h]}"]))
PY
)
mapfile -t O <<< "$OVR"
case $cmd in
  train)
    exec "$PY" bench/metaworld.py train --suite mt10 --run "$RUN" --data data/mt10_hindsight \
      train.precision=fp32 train.num_threads=1 "${O[@]}" ;;
  validate)
    exec "$PY" bench/metaworld.py validate --suite mt10 --run "$RUN" --as "vlastack_hindsight_$H" \
      --trial "$3" ;;
  test)  # every shard with the same settings (2 workers, no videos), so that they merge
    exec "$PY" -m vlastack.cli eval --policy "$RUN/final/ema" --config metaworld_mt10 \
      --out "$RUN/eval_test/$3" --episodes-per-task "$4" --seed "$3" --workers 2 --videos 0 --resume ;;
  merge)
    "$PY" bench/metaworld.py merge "$RUN"/eval_test/*/eval.json --out "$RUN/eval/eval.json"
    exec "$PY" bench/metaworld.py record --suite mt10 --policy "vlastack_hindsight_$H" \
      --eval-json "$RUN/eval/eval.json" --run "$RUN" ;;
  *) echo "unknown command $cmd (train, validate, test, merge)" >&2; exit 2 ;;
esac
