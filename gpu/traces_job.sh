#!/bin/bash
# Study-scale Qwen2.5-Coder-1.5B traces decoded by vLLM and an EAGLE head trained on vLLM-decoded data, on the
# lent H200. Every stage skips what it finished (a marker per stage; train resumes from its checkpoint).
#
# Plan (device seconds; one machine, calls back to back so it stays warm). Measured 2026-12-01:
#   stage    calls  seconds  what
#   vllm       6    ~40      .stage/c1..c7 (vLLM 0.25.0 wheel + deps; c6+c7 in one call)  bash gpu/traces_job.sh vllm cN
#   cache     19    ~100     .carry/pNN (gzip'd stream: Qwen 1.5B GGUF + workloads + HEADS)  bash gpu/traces_job.sh piece pNN
#   setup      1    ~165     install vLLM, reassemble + verify the cache, convert the GGUF, place the traces
#   run     1+polls ~1,320   detached: (1) decode throughput vLLM vs torch engine (COMPARE=0 skips it: committed);
#                            (2) train eagle --engine vllm: model + split ~110 s (sharegpt-turns' histories), engine
#                            start ~87 s, decode ~286 s (21,165 prompts), feature pass ~137 s, then the loop until
#                            TRAIN_BUDGET s after its start; (3) collect --reprofile eagle on the committed traces
#                            (teacher-forced, no decode) ~140 s
#   pack      3     ~50      results + 3 head pieces as soon as TRAINING.json exists (while (3) runs), the other 4
#                            pieces, then the traces (packtraces) when (3) ends
#   In all ~1,680 of 1,800; TRAIN_BUDGET = budget left when it starts - ~300 s (final eval, (3), packing, margin).
#
#   bash gpu/traces_job.sh vllm c1 ... c7          # carry=[".stage/cN"]            (c7: also ".stage/run")
#   bash gpu/traces_job.sh piece p00 ... pNN       # carry=[".carry/pNN"]  (last: also ".carry/extra")
#   bash gpu/traces_job.sh setup                   # carry=[".stage/run", ".carry/extra", ".carry/traces"]
#   TRAIN_LIMIT=480 bash gpu/traces_job.sh start   # the pipeline, detached (setsid): survives between calls
#     (TRAIN_WL / TRAIN_N: the training prompts, default sharegpt + 5,000 later ShareGPT turns + py-functions + py-write;
#      TRAIN_BUDGET=S: the train command stops training S seconds after it starts, whatever the decode took;
#      COMPARE=0 skips stage (1), e.g. when its result is already committed; INIT=DIR continues from that head,
#      e.g. INIT=/root/cache/heads/<sha256> staged by `HEADS=<sha256> gpu/stage_cache.sh`; DECAY: --depth-decay)
#   bash gpu/traces_job.sh status                  # its log tails
#   bash gpu/traces_job.sh pack TAG                # $OUT/res_TAG.tgz + $OUT/head_TAG.partN (16 MiB)
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
    mkdir -p $R/traces && cp .carry/traces/* $R/traces/ && ls $R/traces
    python3 -c "from spec_repro import models; models.convert('$Q')" > $R/log_convert_$Q.txt 2>&1
    tail -n 2 $R/log_convert_*.txt; ls /root/cache/models/*/
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ;;
  start)
    setsid nohup env TRAIN_LIMIT=${TRAIN_LIMIT:-480} ${TRAIN_BUDGET:+TRAIN_BUDGET=$TRAIN_BUDGET} \
      bash gpu/traces_job.sh run > $R/pipeline.log 2>&1 < /dev/null &
    sleep 2; echo started ;;
  run)
    # (1) decode throughput, each engine alone on the GPU (nothing else runs): the committed traces' settings
    if [ "${COMPARE:-64}" != 0 ] && [ ! -f $R/done_compare ]; then
      collect ngram draft early-exit --compare-engines ${COMPARE:-64} > $R/log_compare.txt 2>&1
      rc=$?; echo "compare rc=$rc" >> $R/log_compare.txt; [ $rc = 0 ] && touch $R/done_compare
    fi
    # (2) the head: every training prompt outside the evaluation sources, decoded by vLLM, then trained
    [ -f $HEAD/TRAINING.json ] || sr train eagle --engine vllm --target $Q --out $HEAD \
      --workloads ${TRAIN_WL:-sharegpt sharegpt-turns py-functions py-write} --train-n ${TRAIN_N:-20000 sharegpt-turns=5000} \
      --val-n 64 --max-new-tokens ${TRAIN_NEW:-1024} --steps ${STEPS:-100000} --time-limit $TRAIN_LIMIT \
      ${TRAIN_BUDGET:+--time-budget $TRAIN_BUDGET} --lr ${LR:-8e-4} --tokens-per-batch ${TPB:-16384} \
      --ttt-depth 5 --depth-decay ${DECAY:-0.8} ${INIT:+--init-head $INIT} --device cuda > $R/log_train.txt 2>&1
    echo "train rc=$?" >> $R/log_train.txt
    # (3) eagle profiled again on the committed traces with the new head (teacher-forced over their stored ids)
    if [ -f $HEAD/TRAINING.json ] && [ ! -f $R/done_reprofile ]; then
      collect ngram draft early-exit eagle --eagle-head $HEAD --reprofile eagle > $R/log_collect_C.txt 2>&1
      rc=$?; echo "collect C rc=$rc" >> $R/log_collect_C.txt; [ $rc = 0 ] && touch $R/done_reprofile
    fi
    echo PIPE_FINISHED ;;
  status)
    for f in $R/pipeline.log $R/log_compare.txt $R/log_train.txt $R/log_collect_C.txt; do
      [ -f $f ] && { echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v '^\s*$' | tail -n 6; }
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
  packtraces)   # the finished traces alone, as soon as they exist
    tar czf $OUT/traces_$2.tgz -C $R --exclude='.partial' --exclude='*.lock' traces $(cd $R && ls log_compare.txt log_collect_C.txt 2>/dev/null) && ls -la $OUT ;;
  pack)        # everything into $R/pack; the results + the first 3 head pieces come back now, the rest by `send`
    mkdir -p $R/pack && rm -f $R/pack/*
    tar czf $R/pack/res_$2.tgz -C $R --exclude='heads/*/model.safetensors' --exclude='*.ckpt' --exclude='.partial' \
      --exclude='*.lock' --exclude='pack' . 
    if [ -f $HEAD/model.safetensors ]; then
      sha256sum $HEAD/model.safetensors > $R/pack/head_$2.sha256
      split -b 16M -d -a 1 $HEAD/model.safetensors $R/pack/head_$2.part
    fi
    ls -la $R/pack; cp $R/pack/res_$2.tgz $R/pack/head_$2.sha256 $R/pack/head_$2.part[0-2] $OUT/ 2>/dev/null; ls -la $OUT ;;
  send)        # send PATTERN: more of $R/pack
    cp $R/pack/$2 $OUT/ && ls -la $OUT ;;
esac
