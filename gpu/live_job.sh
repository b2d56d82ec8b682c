#!/bin/bash
# vLLM live with real weights on a lent H200: the live hybrid job (`python -m spec_repro.engines.vllm.jobs hybrid`:
# Qwen2.5-Coder-1.5B-Instruct and the package's EAGLE head; no SD, n-gram, EAGLE and the hybrid policies, each an
# engine over code-edit and sharegpt, bs 1/8/32/64, k 5, 3 repeats; `jobs hybrid --plan` prints its runs), its
# lossless report (every run's outputs against no SD's) and each workload's no-SD outputs profiled with the head on
# the GPU (the step model's input: `python -m spec_repro.engines.vllm.live profile`). Summarized here afterwards:
# `python -m spec_repro.engines.vllm.live summarize --raw DIR` (default `--out data/gpu/live`; the committed V1-runner
# studies are under `data/gpu/v1-runner/`, its README).
#
#   here:  bash ../shared/gpu/prepare.sh; WORKLOADS="code-edit sharegpt" HEADS=<sha256> \
#            bash gpu/stage_cache.sh 60 qwen2.5-coder-1.5b; bash gpu/travel.sh light
#   calls: bash gpu/live_job.sh vllm c1 .. c7        carry [".stage/cN"]   (c6 and c7 in one call)
#          bash gpu/live_job.sh piece pNN            carry [".carry/pNN"]
#          bash gpu/live_job.sh setup                carry [".stage/run", ".carry/extra"] (RESUME=.carry/resume and
#                                                    that folder too: a returned run's stages, gzip'd, placed first)
#          LEFT=<budget_left_s> bash gpu/live_job.sh start      (detached; stops RESERVE s before the lease ends)
#          or LEFT=<budget_left_s> bash gpu/live_job.sh v2start (reproduce --profile gpu's V2 grid: plans/v2hybrid.json;
#                                                    ONLY="lossless grid": those stages and the tables only)
#          sleep S; bash gpu/live_job.sh status live|repro (the logs' tails; that folder so far packed into $OUT)
#          bash gpu/live_job.sh pack live            (the results folder in files of at most 15 MiB)
#   here:  bash gpu/travel.sh restore; the results unpacked and summarized.
# Knobs: HEAD_SHA (a staged head under /root/cache/heads, default the committed one; TRAIN=1: a head trained in
# the run first, TRAIN_BUDGET seconds), METHODS (jobs hybrid's --methods), COST_MODEL (adaptive-rule's), RES (the
# results' root, /root/res), LEFT and RESERVE (the deadline: LEFT - RESERVE s from the start; default 1,150 - 60).
set -u
export SPEC_REPRO_CACHE=/root/cache PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1
R=${RES:-/root/res}; Q=qwen2.5-coder-1.5b; QD=qwen2.5-coder-0.5b
# the committed head (data/heads/qwen2.5-coder-1.5b-eagle: its whole file's sha256), staged by gpu/stage_cache.sh
HEAD_SHA=${HEAD_SHA:-$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['sha256'])" \
  data/heads/$Q-eagle/model.safetensors.parts.json)}
HEAD=/root/cache/heads/$HEAD_SHA
PY=${PY:-python3}
mdir() { $PY -c "from spec_repro import models; print(models.converted_dir('$1'))"; }
left() { echo $(( END - $(date +%s) )); }   # seconds to the run's deadline (END: set by start / run)
detach() {  # detach RUNCASE: that case of this script, detached (setsid: survives between calls); LEFT=S: the
            # lease's budget_left_s now (the deadline: LEFT - RESERVE from now)
  mkdir -p $R
  END=$(( $(date +%s) + ${LEFT:-1150} - ${RESERVE:-60} ))
  echo $END > $R/end_epoch
  setsid nohup env END=$END bash gpu/live_job.sh $1 > $R/pipeline.log 2>&1 < /dev/null &
  sleep 2; echo "started; deadline in $(( END - $(date +%s) )) s"
}
train_head() {  # train_head DIR: an EAGLE head for Qwen 1.5B (skipped when DIR has one)
  [ -f $1/TRAINING.json ] && return 0
  $PY -m spec_repro.cli train eagle --engine vllm --target $Q --out $1 --workloads ${TRAIN_WL:-sharegpt py-functions py-write} \
    --train-n ${TRAIN_N:-7000} --val-n 64 --max-new-tokens ${TRAIN_NEW:-512} --steps 100000 \
    --time-budget ${TRAIN_BUDGET:-520} --lr ${LR:-8e-4} --tokens-per-batch 16384 --ttt-depth 5 --depth-decay 1.0 \
    --device cuda > $R/log_t.txt 2>&1
  echo "train rc=$?" >> $R/log_t.txt
}
host_txt() {  # host_txt DIR: the host now (CPU, its clocks, the GPU's clocks and state) into DIR/host.txt
  { lscpu; grep MHz /proc/cpuinfo | sort | uniq -c | sort -rn | head -5; nvidia-smi -q -d CLOCK,PERFORMANCE; } \
    > $1/host.txt 2>&1
}
new_head() {  # new_head DIR: the host into DIR/host.txt, then a head trained into DIR/head (train_head), its sha256
             # and TRAINING.json beside; rc 1 when no head came out
  mkdir -p $1; host_txt $1
  train_head $1/head
  [ -f $1/head/TRAINING.json ] || return 1
  touch $R/done_t
  sha256sum $1/head/model.safetensors > $1/head.sha256
  cp $1/head/TRAINING.json $1/head_TRAINING.json; cp $1/head/config.json $1/head_config.json
}
head_into() {  # head_into DIR: the staged head $HEAD checked, its sha256, TRAINING.json, config.json and the host
               # into DIR; rc 1 when no head is staged
  [ -f $HEAD/model.safetensors ] || { echo "no head $HEAD: stage it (HEADS=)"; return 1; }
  mkdir -p $1
  sha256sum $HEAD/model.safetensors > $1/head.sha256
  cp $HEAD/TRAINING.json $1/head_TRAINING.json; cp $HEAD/config.json $1/head_config.json
  host_txt $1 || true       # the host's description: best effort (no nvidia-smi on a CPU machine)
}
profile_raw() {  # profile_raw WORKLOAD HEAD OUT: this run's no-SD outputs of WORKLOAD (bs 64, repeat 0, in OUT's
                 # folder) profiled with HEAD on the GPU (the predictor's input); once per workload (done_p_WORKLOAD)
  [ $(left) -gt 60 ] && [ ! -f $R/done_p_$1 ] || return 0
  $PY -m spec_repro.engines.vllm.live profile --raw $(dirname $3) --workload $1 --head $2 --device cuda --out $3 \
    > $R/log_p_$1.txt 2>&1 && touch $R/done_p_$1
  echo "profile rc=$?" >> $R/log_p_$1.txt
}
case "$1" in
  vllm)       # vllm cN [cM]: pieces of the vLLM wheel (../shared/gpu/prepare.sh), as traces_job.sh stages them
    for c in "${@:2}"; do bash gpu/traces_job.sh vllm $c || exit 1; done ;;
  piece)      # a piece of gpu/stage_cache.sh's stream
    bash gpu/traces_job.sh piece $2 ;;
  setup)
    bash .stage/run/install.sh || exit 2
    bash gpu/device.sh cache || exit 3
    bash gpu/device.sh setup                                  # the plugin's entry point (hybrid + step logs)
    mkdir -p $R
    for m in $Q $QD; do
      [ -d /root/cache/models/$m ] || { echo "$m not staged: not converted"; continue; }
      $PY -c "from spec_repro import models; models.convert('$m')" > $R/log_convert_$m.txt 2>&1 \
        || { tail -n 5 $R/log_convert_$m.txt; exit 4; }
    done
    if [ -n "${RESUME:-}" ]; then      # a returned run's finished stages (gzip'd) placed first: v2run skips them
      mkdir -p $R/repro/gpu && cp -r $RESUME/. $R/repro/gpu/ && find $R/repro/gpu -name '*.gz' -exec gunzip -f {} +
      find $R/repro/gpu -type f | head -n 20
    fi
    tail -n 2 $R/log_convert_*.txt; ls /root/cache/models/*/ $HEAD ;;
  start)      # the run, detached (setsid): survives between calls. LEFT=S: the lease's budget_left_s now
    detach run ;;   # RESERVE (default 60 s): the last pack call + margin
  run)        # in the foreground (start runs it detached); END: epoch seconds of the deadline (default 1,100 s on)
    END=${END:-$(( $(date +%s) + 1100 ))}
    D=$R/live
    if [ -n "${TRAIN:-}" ]; then
      new_head $D || { echo "no head: stop"; echo PIPE_FINISHED; exit 3; }; HEAD=$D/head
    else
      head_into $D || { echo PIPE_FINISHED; exit 3; }
    fi
    if [ ! -f $R/done_h ]; then      # resumable: jobs hybrid skips the engines that finished
      $PY -m spec_repro.engines.vllm.jobs hybrid --head $HEAD --out $D --model-dir $(mdir $Q) --deadline $(left) \
        ${METHODS:+--methods $METHODS} ${COST_MODEL:+--cost-model $COST_MODEL} > $R/log_h.txt 2>&1
      rc=$?; echo "hybrid rc=$rc" >> $R/log_h.txt
      $PY -m spec_repro.engines.vllm.jobs lossless --out $D > $D/lossless.jsonl 2>> $R/log_h.txt
      [ $rc = 0 ] && ! grep -q 'not started' $R/log_h.txt && touch $R/done_h
    fi
    profile_raw code-edit $HEAD $D/hybrid_trace_s1.jsonl
    profile_raw sharegpt $HEAD $D/hybrid_trace_sharegpt_s1.jsonl
    echo PIPE_FINISHED ;;
  v2start)    # the V2-runner hybrid job (gpu/plans/v2hybrid.json), detached; LEFT=S as for start
    detach v2run ;;
  v2run)      # the GPU part of `reproduce --profile gpu` (gpu_profile run: lossless and its gate, the timer's cost,
              # the grid, the profile, the tables; traces and llama when the deadline leaves time) into $R/repro/gpu;
              # resumable: a finished stage or engine is skipped
    END=${END:-$(( $(date +%s) + 1100 ))}
    D=$R/repro/gpu
    head_into $D || { echo PIPE_FINISHED; exit 3; }
    $PY -m spec_repro.engines.vllm.gpu_profile run --out $D --head $HEAD --deadline $(left) --timeout 1500 \
      ${ONLY:+--only $ONLY} \
      >> $R/log_v.txt 2>&1
    echo "gpu_profile rc=$?" >> $R/log_v.txt
    echo PIPE_FINISHED ;;
  stop)       # the detached pipeline and every engine it started (a run that must restart in another order)
    pkill -f "live_job.sh run"; pkill -f "live_job.sh v2run"; pkill -f "spec_repro.engines.vllm"; sleep 3
    pkill -9 -f "spec_repro.engines.vllm"; pkill -9 -f EngineCore; sleep 2
    nvidia-smi --query-gpu=memory.used --format=csv,noheader ;;
  status)     # status [DIR]: the logs' tails; with DIR also that results folder so far into $OUT (every poll
              # brings it back: a machine lost between calls loses at most what ran since the last poll)
    [ -n "${2:-}" ] && bash gpu/live_job.sh pack $2 > /dev/null
    for f in $R/pipeline.log $R/log_[a-z].txt $R/log_p_*.txt; do
      [ -f $f ] && { echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v -E '^\s*$|^(INFO|DEBUG)' | tail -n 5; }
    done
    ls $R/done_* 2>/dev/null | sed 's|.*/done_|done: |'
    [ -f $R/end_epoch ] && echo "deadline in $(( $(cat $R/end_epoch) - $(date +%s) )) s"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ;;
  pack)       # pack DIR|all: that results folder under $R (live: the run's), or all of $R, as one file
    case $2 in all) d=. ;; *) d=$2 ;; esac
    tar czf $OUT/res_$2.tgz -C $R --exclude='*.lock' --exclude='model.safetensors' --exclude='*.pt' $d $([ $d = . ] || (cd $R && ls log_*.txt pipeline.log 2>/dev/null))
    if [ $(stat -c %s $OUT/res_$2.tgz) -ge 15000000 ]; then     # a call brings back files of 16 MiB at most
      split -b 15M -d -a 1 $OUT/res_$2.tgz $OUT/res_$2.tgz.part && rm $OUT/res_$2.tgz; fi
    ls -la $OUT ;;
  send)       # send FILE: a part of a split pack (split -b 15M $OUT/... first)
    cp $R/$2 $OUT/ && ls -la $OUT ;;
  *) echo "stages: vllm piece setup start run v2start v2run stop status pack send"; exit 2 ;;
esac
