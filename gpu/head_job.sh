#!/bin/bash
# The Qwen2.5-Coder-1.5B EAGLE head, trained on the lent H200 and brought back in parts of at most 16 MiB (committed
# under data/heads/qwen2.5-coder-1.5b-eagle/ with their sha256; `spec_repro.parts` joins and verifies them on load).
# The target's decodes of the training prompts come back too (data/heads/decodes/qwen2.5-coder-1.5b/): a later run
# that continues the head (INIT=) reads them instead of decoding again (DECODES=; staged by DECODES=1 gpu/stage_cache.sh).
# The plan, stage by stage, with the seconds it took: gpu/plans/head.json.
#
#   here:  bash ../shared/gpu/prepare.sh; WORKLOADS="sharegpt sharegpt-turns py-functions py-write code-edit \
#            gsm-symbolic humaneval mt-bench" bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b; bash gpu/travel.sh light
#   calls: bash gpu/head_job.sh vllm c1 .. c7        carry [".stage/cN"]   (c6 and c7 in one call)
#          bash gpu/head_job.sh piece pNN            carry [".carry/pNN"]   (stage_cache.sh ... qwen2.5-coder-0.5b:
#                                                      the grid's draft-model engine; converted in the run)
#          bash gpu/head_job.sh setup                carry [".stage/run", ".carry/extra"]
#          LEFT=<budget_left_s> bash gpu/head_job.sh start      (detached; the training stops LEFT - MARGIN s later)
#          sleep S; bash gpu/head_job.sh status      (the logs; once the head is split, its record into $OUT)
#          bash gpu/head_job.sh back 0-3             (parts 0..3 of files.txt into $OUT: 64 MiB at most a call)
#   here:  bash gpu/travel.sh restore; the parts, manifests, config.json and TRAINING.json into
#          data/heads/qwen2.5-coder-1.5b-eagle/, the decodes' into data/heads/decodes/qwen2.5-coder-1.5b/
# Knobs: INIT=DIR (continue that head: data/heads/qwen2.5-coder-1.5b-eagle, staged), DECODES=FILE (a decodes file: read
# when it exists, e.g. data/heads/decodes/qwen2.5-coder-1.5b/decodes.parquet.parts.json once staged, else written),
# LR, DECAY (--depth-decay), MARGIN (seconds kept after training for the calls that bring it back; default 170),
# GRID=1 (the V2 grid in the time left), GRID_ONLY / GRID_FIRST (its specs: all of them / those run before the training),
# COGRID=1 (its no-SD and EAGLE engines resident together, runs rotated: v2grid run --co-resident), REPROFILE=1 (the
# traces' eagle column with this head), CONFIDENCE=1 (ShareGPT decoded afresh, the draft model's and early exit's
# confidence on the other traces: gpu/plans/confidence.json).
set -u
export SPEC_REPRO_CACHE=/root/cache PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1
R=/root/res; Q=qwen2.5-coder-1.5b; HEAD=$R/head; BACK=$R/back
mkdir -p $R
listback() { (cd $BACK && ls | grep -E '\.part[0-9]+$|\.tgz$' | grep -v logs.tgz > files.txt); }   # what `back` sends
qcollect() {  # the Qwen traces' collect: vLLM's decodes, the four proposers, the head $H; then workloads and the rest
  python3 -m spec_repro.cli collect --engine vllm --model $Q --max-new-tokens 2048 --k-max 16 --proposers ngram draft \
    early-exit eagle --draft-model qwen2.5-coder-0.5b --eagle-head $H --device cuda --batch-size 32 --out $R/traces "$@"
}
case "$1" in
  vllm)  shift; mkdir -p /root/stage && for c in "$@"; do cp .stage/$c/* /root/stage/; done; ls /root/stage | wc -l ;;
  piece) bash gpu/device.sh piece $2 ;;
  setup)
    bash .stage/run/install.sh || exit 2
    bash gpu/device.sh cache || exit 3
    python3 -c "from spec_repro import models; models.convert('$Q')" > $R/log_convert.txt 2>&1; tail -n 2 $R/log_convert.txt
    [ -d .carry/traces ] && mkdir -p $R/traces && cp .carry/traces/* $R/traces/ && ls $R/traces
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ;;
  start)      # LEFT=<budget_left_s>: the pipeline ends MARGIN s before the lease does; TRAIN_S: the training's share
    E=$(( ${LEFT:?LEFT=<budget_left_s>} - ${MARGIN:-170} )); echo $(( $(date +%s) + E )) > $R/end_epoch
    setsid nohup env TRAIN_S=${TRAIN_S:-$E} bash gpu/head_job.sh run > $R/pipeline.log 2>&1 < /dev/null &
    sleep 2; echo "started: ends in $E s, training budget ${TRAIN_S:-$E} s" ;;
  run)
    # the draft model's GGUF, where staged, converted beside the work before the grid (its draft-model engine)
    D=qwen2.5-coder-0.5b
    [ "${GRID:-0}" = 1 ] && [ -f $SPEC_REPRO_CACHE/models/$D/info.json ] && { python3 -c "
from spec_repro import models; models.convert('$D')" > $R/log_convert_draft.txt 2>&1 & }
    # (0) GRID_FIRST="<spec> ...": grid engines that need no head (no SD) before the training, so that the grid's
    #     path has run once before the head's time is spent (the later grid skips what finished)
    if [ "${GRID:-0}" = 1 ] && [ -n "${GRID_FIRST:-}" ]; then
      python3 -m spec_repro.engines.vllm.v2grid run --head data/heads/$Q-eagle --out $R/v2grid --only $GRID_FIRST \
        --deadline $(( $(cat $R/end_epoch) - $(date +%s) )) >> $R/log_grid.txt 2>&1
      echo "grid first rc=$?" >> $R/log_grid.txt
    fi
    # (1) the head: trained (or continued: INIT, DECODES) unless TRAIN_S=0
    if [ "${TRAIN_S:-0}" != 0 ] && [ ! -f $HEAD/TRAINING.json ]; then
      # (the split tokenizes ~65k prompts: threaded here; kept decodes mean no vLLM engine forks this process)
      TOKENIZERS_PARALLELISM=true python3 -m spec_repro.cli train eagle --engine vllm --target $Q --out $HEAD \
        --workloads sharegpt sharegpt-turns py-functions py-write --train-n 20000 sharegpt-turns=5000 --val-n 64 \
        --max-new-tokens 1024 --steps 100000 --time-budget $TRAIN_S --lr ${LR:-8e-4} --tokens-per-batch 16384 \
        --ttt-depth 5 --depth-decay ${DECAY:-0.8} ${INIT:+--init-head $INIT} --decodes ${DECODES:-$R/decodes.parquet} \
        --device cuda > $R/log_train.txt 2>&1
      echo "train rc=$?" >> $R/log_train.txt
    fi
    mkdir -p $BACK
    if [ -f $HEAD/TRAINING.json ] && [ ! -f $BACK/done_head ]; then   # the head and new decodes, in parts
      python3 -c "
from spec_repro.parts import split
split('$HEAD/model.safetensors', '$BACK')
import os; d = '$R/decodes.parquet'
os.path.isfile(d) and split(d, '$BACK', name='decodes.parquet')"
      cp $HEAD/TRAINING.json $HEAD/config.json $BACK/ && tar czf $BACK/logs.tgz -C $R log_train.txt pipeline.log log_convert.txt
      touch $BACK/done_head; listback
    fi
    H=$HEAD; [ -f $HEAD/TRAINING.json ] || H=data/heads/$Q-eagle     # else the committed head (staged)
    # (2) the committed traces' eagle column profiled again with this head (teacher forcing over their stored
    #     vLLM outputs; setup placed them in $R/traces from .carry/traces)
    if [ "${REPROFILE:-0}" = 1 ] && [ ! -f $R/done_reprofile ]; then
      qcollect --workloads sharegpt code-edit gsm-symbolic humaneval mt-bench -n 300 --upto --reprofile eagle \
        > $R/log_reprofile.txt 2>&1 && touch $R/done_reprofile
      echo "reprofile rc=$?" >> $R/log_reprofile.txt
      [ -f $R/done_reprofile ] && tar czf $BACK/traces.tgz -C $R --exclude='.partial' --exclude='*.lock' traces \
        log_reprofile.txt && listback
    fi
    # (2b) CONFIDENCE=1: ShareGPT decoded afresh on the sharegpt workload (400 drawn; outputs under 32 tokens left
    #      out, reported apart in the manifest), every proposer with its confidence; then the draft model's and
    #      early exit's confidence on the other four traces (teacher forcing over their stored vLLM outputs)
    if [ "${CONFIDENCE:-0}" = 1 ] && [ ! -f $R/done_confidence ]; then
      rm -f $R/traces/${Q}__sharegpt.parquet     # the earlier draw's trace, where carried: decoded afresh
      { qcollect --workloads sharegpt -n 400 --min-output-len 32 && qcollect --workloads code-edit gsm-symbolic \
          humaneval mt-bench -n 300 --upto --reprofile draft early-exit; } > $R/log_confidence.txt 2>&1 \
        && touch $R/done_confidence
      echo "confidence rc=$?" >> $R/log_confidence.txt
      tar czf $BACK/traces.tgz -C $R --exclude='.partial' --exclude='*.lock' traces log_confidence.txt && listback
    fi
    # (3) the V2 grid (spec_repro.engines.vllm.v2grid: vLLM's own runner, uninstrumented) in the time left
    if [ "${GRID:-0}" = 1 ]; then
      wait      # the draft model's conversion
      python3 -m spec_repro.engines.vllm.v2grid run --head $H --out $R/v2grid ${GRID_ONLY:+--only $GRID_ONLY} \
        ${COGRID:+--co-resident} --deadline $(( $(cat $R/end_epoch) - $(date +%s) )) >> $R/log_grid.txt 2>&1
      echo "grid rc=$?" >> $R/log_grid.txt
      tar czf $BACK/v2grid.tgz -C $R v2grid log_grid.txt && listback
    fi
    echo PIPE_FINISHED ;;
  grid)       # the grid's results so far (resumable: a later run skips finished engines), into $OUT
    tar czf $OUT/v2grid_now.tgz -C $R v2grid log_grid.txt 2>/dev/null; ls -la $OUT ;;
  status)
    for f in $R/pipeline.log $R/log_train.txt $R/log_reprofile.txt $R/log_confidence.txt $R/log_grid.txt; do
      [ -f $f ] && { echo "== $f"; tail -c 2500 $f | tr '\r' '\n' | grep -v -E '^\s*$|^(INFO|DEBUG)' | tail -n 6; }
    done
    [ -f $R/end_epoch ] && echo "budget ends in $(( $(cat $R/end_epoch) - $(date +%s) )) s"
    [ -f $BACK/files.txt ] && { cp $BACK/*.json $BACK/files.txt $BACK/logs.tgz $OUT/ 2>/dev/null; cat -n $BACK/files.txt | tr '\n' ' '; echo; }
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
  back)  # back A-B: files A..B (0-based) of $BACK/files.txt into $OUT (64 MiB at most a call: 4 head parts)
    [ -f $BACK/files.txt ] || { echo "nothing to bring back yet"; exit 0; }
    sed -n "$(( ${2%-*} + 1 )),$(( ${2#*-} + 1 ))p" $BACK/files.txt | while read f; do cp $BACK/$f $OUT/; done; ls -la $OUT ;;
  stop)
    pkill -f "head_job.sh run"; pkill -f "spec_repro"; sleep 3; pkill -9 -f "spec_repro"; pkill -9 -f EngineCore
    nvidia-smi --query-gpu=memory.used --format=csv,noheader ;;
  *) echo "stages: vllm piece setup start run status back grid stop"; exit 2 ;;
esac
