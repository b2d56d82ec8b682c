#!/bin/bash
# The EAGLE work on the lent H200 (torch engine, no vLLM): heads trained by self-distillation, study-scale traces,
# drafting-time measurements. Run from the repo root on the device after the cache pieces have been carried
# (bash gpu/device.sh piece pNN ...; bash gpu/device.sh cache). Every stage skips what it finished before, so a
# stage cut by a call's time limit continues in the next call. Results under /root/res; `pack` brings them back.
#   bash gpu/eagle_job.sh heads        # SmolLM2 head + Qwen conversions in parallel, then the Qwen head
#   bash gpu/eagle_job.sh collect      # Qwen2.5-Coder-1.5B traces, one process per workload, in parallel
#   bash gpu/eagle_job.sh timings      # per-step phase timings (none / ngram / eagle / draft / early-exit)
#   bash gpu/eagle_job.sh pack TAG     # $OUT/res_TAG.tgz (the Qwen head's weights stay behind: too large)
set -u
export SPEC_REPRO_CACHE=/root/cache PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=/root/res; mkdir -p $R/heads
Q=qwen2.5-coder-1.5b; QD=qwen2.5-coder-0.5b; S=smollm2-135m
EVAL_N=${EVAL_N:-300}
sr() { python3 -m spec_repro.cli "$@"; }
train() {  # target out [extra args]
  local t=$1 o=$2; shift 2
  [ -f $o/TRAINING.json ] && { echo "$o done"; return 0; }
  sr train eagle --target $t --out $o --workloads sharegpt code-edit gsm-symbolic --eval-n $EVAL_N \
    --train-n ${TRAIN_N:-1500} --val-n 48 --max-new-tokens ${TRAIN_TOKENS:-384} --batch-size 256 \
    --ttt-depth 3 --device cuda "$@"
}
case "$1" in
  heads)
    (train $S $R/heads/$S-eagle --steps ${SMOL_STEPS:-600} --lr 1e-3 --tokens-per-batch 16384 \
       > $R/log_train_$S.txt 2>&1) &
    (python3 -c "from spec_repro import models; [models.convert(m) for m in ('$QD', '$Q')]" > $R/log_convert.txt 2>&1) &
    wait
    tail -c 600 $R/log_train_$S.txt; tail -3 $R/log_convert.txt
    train $Q $R/heads/$Q-eagle --steps ${QWEN_STEPS:-500} --lr 5e-4 --tokens-per-batch 16384 > $R/log_train_$Q.txt 2>&1
    tail -c 600 $R/log_train_$Q.txt ;;
  all2)      # both heads at once, then the traces and the timings
    (TRAIN_N=400 TRAIN_TOKENS=256 train $S $R/heads/$S-eagle --steps 500 --lr 1e-3 --tokens-per-batch 16384 \
       > $R/log_train_$S.txt 2>&1) &
    TRAIN_N=600 TRAIN_TOKENS=256 train $Q $R/heads/$Q-eagle --steps 300 --lr 6e-4 --tokens-per-batch 16384 \
       > $R/log_train_$Q.txt 2>&1
    wait; for s in collect timings; do bash $0 $s; done; echo PIPE_FINISHED ;;
  rest)      # what follows the SmolLM2 head, in one detached pipeline
    for s in qwenhead collect timings; do bash $0 $s; done; echo PIPE_FINISHED ;;
  qwenhead)
    train $Q $R/heads/$Q-eagle --steps ${QWEN_STEPS:-500} --lr 5e-4 --tokens-per-batch 16384 > $R/log_train_$Q.txt 2>&1
    tail -c 600 $R/log_train_$Q.txt ;;
  collect)
    for w in sharegpt code-edit gsm-symbolic humaneval mt-bench; do
      n=$EVAL_N; [ $w = humaneval ] && n=164; [ $w = mt-bench ] && n=80
      sr collect --model $Q --workloads $w -n $n --max-new-tokens ${MAX_NEW:-1024} --k-max 16 \
        --proposers ngram eagle draft early-exit --draft-model $QD --eagle-head $R/heads/$Q-eagle \
        --batch-size ${COLLECT_BS:-$n} --device cuda --out $R/traces_$w > $R/log_collect_$w.txt 2>&1 &
    done
    wait
    for w in sharegpt code-edit gsm-symbolic humaneval mt-bench; do tail -c 300 $R/log_collect_$w.txt; echo; done ;;
  timings)
    python3 - <<'PY' > $R/log_timings.txt 2>&1
import os, torch
from spec_repro.collect import engine_step_timings
R = "/root/res"
for model, kw in (("qwen2.5-coder-1.5b", dict(draft_model="qwen2.5-coder-0.5b",
                   eagle_head=f"{R}/heads/qwen2.5-coder-1.5b-eagle", methods=("none", "ngram", "eagle", "draft", "early-exit"))),
                  ("smollm2-135m", dict(eagle_head=f"{R}/heads/smollm2-135m-eagle", methods=("none", "ngram", "eagle", "early-exit")))):
    out = f"{R}/torch_engine_steps_{model}_h200.parquet"
    if os.path.exists(out):
        continue
    df = engine_step_timings(model, "code-edit", n=2, max_new_tokens=48, batch_sizes=(1, 16), k=3, device="cuda", **kw)
    df.to_parquet(out, index=False)
    dec = df[df.phase == "decode"]
    print(model, dec.groupby(["method", "batch_size"])[["t_draft", "t_verify", "t_reject", "t_other"]].mean().mul(1e3).round(2).to_string())
PY
    tail -40 $R/log_timings.txt ;;
  pack)
    tar czf $OUT/res_$2.tgz -C $R --exclude="heads/$Q-eagle/model.safetensors" --exclude='*.ckpt' --exclude='.partial' . \
      && ls -la $OUT/res_$2.tgz
    sha256sum $R/heads/*/model.safetensors > $OUT/heads_sha256_$2.txt 2>/dev/null; true ;;
esac
