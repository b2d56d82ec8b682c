#!/bin/bash
# Study-scale Qwen2.5-Coder-1.5B traces decoded by vLLM and an EAGLE head trained on vLLM-decoded data, on the
# lent H200. Every stage skips what it finished (collect resumes from its partial files; train from its checkpoint).
#
# Plan (device seconds; one machine, calls back to back so it stays warm):
#   stage   calls  seconds  what
#   vllm      7     ~60     .stage/c1..c7 (vLLM 0.25.0 wheel + deps)      bash gpu/traces_job.sh vllm cN
#   cache    ~26   ~150     .carry/pNN (Qwen 1.5B + 0.5B GGUFs, workloads) bash gpu/traces_job.sh piece pNN
#   setup     1     ~150    install vLLM, reassemble + verify the cache, convert both GGUFs (in parallel)
#   run       1+polls ~900  detached: (A) collect --engine vllm (ngram, draft, early-exit) in parallel with
#                           (B) train eagle --engine vllm (8M+ target tokens, depth 5); then (C) collect adds eagle
#   pack      1-2    ~30    traces + TRAINING.json + logs, head weights in 16 MiB pieces
#
#   bash gpu/traces_job.sh vllm c1 ... c7          # carry=[".stage/cN"]            (c7: also ".stage/run")
#   bash gpu/traces_job.sh piece p00 ... pNN       # carry=[".carry/pNN"]  (last: also ".carry/extra")
#   bash gpu/traces_job.sh setup                   # carry=[".stage/run", ".carry/extra"]
#   bash gpu/traces_job.sh start                   # the pipeline, detached (setsid): survives between calls
#   bash gpu/traces_job.sh status                  # its log tails
#   bash gpu/traces_job.sh pack TAG                # $OUT/res_TAG.tgz + $OUT/head_TAG.partNN
set -u
export SPEC_REPRO_CACHE=/root/cache PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1
R=/root/res; mkdir -p $R/heads
Q=qwen2.5-coder-1.5b; QD=qwen2.5-coder-0.5b
HEAD=$R/heads/$Q-eagle
MAX_NEW=${MAX_NEW:-2048}
sr() { python3 -m spec_repro.cli "$@"; }
collect() {  # proposers...
  sr collect --engine vllm --model $Q --workloads sharegpt code-edit gsm-symbolic humaneval mt-bench -n 300 --upto \
    --max-new-tokens $MAX_NEW --k-max 16 --proposers "$@" --draft-model $QD ${EXTRA_COLLECT:-} \
    --device cuda --batch-size 32 --out $R/traces
}
case "$1" in
  vllm)
    mkdir -p /root/stage && cp .stage/$2/* /root/stage/ && ls /root/stage | wc -l ;;
  piece)
    mkdir -p /root/stage && cp .carry/$2/* /root/stage/ && ls /root/stage | wc -l ;;
  setup)
    bash .stage/run/install.sh || exit 2
    bash gpu/device.sh cache || exit 3
    for m in $QD $Q; do
      (python3 -c "from spec_repro import models; models.convert('$m')" > $R/log_convert_$m.txt 2>&1) &
    done
    wait; tail -n 2 $R/log_convert_*.txt; ls /root/cache/models/*/
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ;;
  start)
    setsid nohup bash gpu/traces_job.sh run > $R/pipeline.log 2>&1 < /dev/null &
    sleep 2; echo started ;;
  run)
    # (A) traces without eagle (vLLM decode + teacher-forced draft / early-exit / n-gram), beside (B) training
    ( EXTRA_COLLECT="${COMPARE:+--compare-engines $COMPARE}" collect ngram draft early-exit > $R/log_collect_A.txt 2>&1;
      echo "collect A rc=$?" >> $R/log_collect_A.txt ) &
    # B starts once A's engine comparison (if asked: COMPARE=N) is done (each engine timed alone), at most 400 s
    for i in $(seq 80); do [ -z "${COMPARE:-}" ] && break; [ -f $R/traces/.partial/engine_comparison.json ] && break
      grep -q "rc=" $R/log_collect_A.txt 2>/dev/null && break; sleep 5; done; sleep 15
    [ -f $HEAD/TRAINING.json ] || sr train eagle --engine vllm --target $Q --out $HEAD \
      --workloads sharegpt py-functions --train-n ${TRAIN_N:-6000} --val-n 64 --max-new-tokens ${TRAIN_NEW:-1024} \
      --steps ${STEPS:-500} --time-limit ${TRAIN_LIMIT:-180} --lr 6e-4 --tokens-per-batch 16384 --ttt-depth 5 --device cuda > $R/log_train.txt 2>&1
    echo "train rc=$?" >> $R/log_train.txt
    wait
    # (C) the eagle proposer added to the finished traces (teacher-forced, no new decode)
    collect ngram draft early-exit eagle --eagle-head $HEAD > $R/log_collect_C.txt 2>&1
    echo "collect C rc=$?" >> $R/log_collect_C.txt
    echo PIPE_FINISHED ;;
  status)
    for f in $R/pipeline.log $R/log_collect_A.txt $R/log_train.txt $R/log_collect_C.txt; do
      [ -f $f ] && { echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v '^\s*$' | tail -n 6; }
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
  packtraces)   # the finished traces alone, as soon as they exist
    tar czf $OUT/traces_$2.tgz -C $R --exclude='.partial' --exclude='*.lock' traces log_collect_A.txt && ls -la $OUT ;;
  pack)
    tar czf $OUT/res_$2.tgz -C $R --exclude='heads/*/model.safetensors' --exclude='*.ckpt' --exclude='.partial' \
      --exclude='*.lock' . && ls -la $OUT/res_$2.tgz
    if [ -f $HEAD/model.safetensors ]; then
      sha256sum $HEAD/model.safetensors > $OUT/head_$2.sha256
      split -b 16M -d -a 1 $HEAD/model.safetensors $OUT/head_$2.part
    fi
    ls -la $OUT ;;
esac
