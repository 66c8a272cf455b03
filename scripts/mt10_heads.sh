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
# HEAD: oft, fast, bins_parallel_l1, bins_ar_h1. Needs data/mt10_hindsight (docs/metaworld.md). A
# head kept in bench/results/policies/mt10_HEAD is restored as a run with
# `cp -r bench/results/policies/mt10_HEAD runs/`; its shards are in its eval_test/ folder.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=${MUJOCO_GL:-egl}
PY=${PY:-.venv/bin/python}
cmd=$1
H=$2
RUN=runs/mt10_$H
BINS=(model.head=tokens model.head_options.tokenizer=bins model.head_options.num_bins=256
      model.head_options.placement=new_rows model.head_options.bin_sigma=2)
case $H in  # each head's built-in-suite recipe (docs/heads.md), and its step budget
  oft) O=(model.head=oft model.head_options.hidden=256 model.head_options.l1=true train.steps=11942) ;;
  fast) O=(model.head=tokens model.head_options.tokenizer=fast model.head_options.placement=new_rows
           model.head_options.fast_vocab_size=41 model.head_options.max_action_tokens=16
           model.action_horizon=4 model.head_options.bin_sigma=2 train.steps=11117) ;;
  bins_parallel_l1) O=("${BINS[@]}" model.head_options.decoding=parallel
                       model.head_options.regression_head=true train.steps=9734) ;;
  bins_ar_h1) O=("${BINS[@]}" model.action_horizon=1 train.steps=12098) ;;
  *) echo "unknown head $H (oft, fast, bins_parallel_l1, bins_ar_h1)" >&2; exit 2 ;;
esac
case $cmd in
  train)
    exec "$PY" bench/metaworld.py train --suite mt10 --run "$RUN" --data data/mt10_hindsight \
      'model.grounding.state_index=[]' train.precision=fp32 train.num_threads=1 \
      data.norm.action=quantiles "${O[@]}" ;;
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
