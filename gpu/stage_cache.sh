#!/bin/bash
# Stage this machine's spec_repro cache (embedded models' GGUFs + workload data) for the lent GPU machine, which
# reaches no package index: one tar stream, cut into pieces small enough to ride along one device call each.
#   bash gpu/stage_cache.sh [MB_PER_PIECE] MODEL...      e.g.  bash gpu/stage_cache.sh 54 smollm2-135m qwen2.5-coder-1.5b
#   WORKLOADS="code-edit sharegpt ..." stages only those workloads (default: all, sharegpt-turns' 156 MB included)
#   Each MODEL's committed EAGLE head (data/heads/, joined from its parts and verified) comes along by default
#   (NO_HEAD=1: not); DECODES=1 adds its committed training decodes (data/heads/decodes/MODEL/, for a run that
#   continues the head); HEADS="<sha256> ..." adds other trained heads ($SPEC_REPRO_CACHE/heads/<sha256>/)
# Result: .carry/pNN/ and .carry/extra/ (the gguf wheel) (one device call each: carry=[".carry/pNN"], command `bash gpu/device.sh piece pNN`), then
# `bash gpu/device.sh cache` on the device reassembles the stream, untars it under /root/cache and checks every
# GGUF against the sha256 the package pins. Run `spec-repro models fetch MODEL` and the workloads once here first.
set -euo pipefail
MB=${1:-52}; shift   # 52 MiB + the tracked tree (~11 MB) stays under a call's 64 MiB
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
C=${SPEC_REPRO_CACHE:-$HOME/.cache/spec_repro}
rm -rf .carry/p[0-9]* .carry/parts .carry/extra; mkdir -p .carry/parts .carry/extra
python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/extra "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
# NB_WHEELS=1: also the notebook stack (papermill, jupytext, ipykernel and what they need that the lent machine's image
# lacks: KINDS.md's package list), as this machine's versions, for its Python 3.12 (`reproduce --profile gpu` there)
if [ "${NB_WHEELS:-0}" = 1 ]; then
  pins=$(python3 - <<'PY'
import importlib.metadata as m
names = """asttokens comm debugpy entrypoints executing fastjsonschema ipykernel ipython ipython_pygments_lexers jedi
jsonschema jsonschema-specifications jupyter_client jupyter_core jupytext matplotlib-inline mdit-py-plugins nbclient
nbformat papermill parso pexpect platformdirs prompt_toolkit ptyprocess pure_eval referencing rpds-py stack-data
tenacity tornado traitlets wcwidth""".split()
print(" ".join(f"{n}=={m.version(n)}" for n in names))
PY
)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d .carry/extra $pins
fi
paths=(workloads)
[ -n "${WORKLOADS:-}" ] && { paths=(); for w in $WORKLOADS; do paths+=("workloads/$w"); done; }
for h in ${HEADS:-}; do [ -f "$C/heads/$h/model.safetensors" ] || { echo "no head $C/heads/$h"; exit 2; }; paths+=("heads/$h"); done
for m in "$@"; do
  f=$(python3 -c "from spec_repro import models; print(models.spec('$m').gguf_file)")
  paths+=("models/$m/$f" "models/$m/info.json")
  [ "${NO_HEAD:-0}" = 1 ] && continue
  h=$(python3 -c "
from spec_repro.proposers.eagle_files import COMMITTED_HEADS, committed_head
print(committed_head('$m') if '$m' in COMMITTED_HEADS else '')") || exit 3
  case "$h" in "$C"/heads/*) paths+=("heads/$(basename "$h")"); echo "head: $h" ;; esac
  dm=data/heads/decodes/$m/decodes.parquet.parts.json
  if [ "${DECODES:-0}" = 1 ] && [ -f $dm ]; then
    d=$(python3 -c "from spec_repro.parts import cached; print(cached('$dm'))") || exit 3
    paths+=("${d#$C/}"); echo "decodes: $d"
  fi
done
# gzip -1: the workloads' text (sharegpt-turns' 163 MB of chat histories) shrinks ~4x, the quantized GGUFs pass through
tar cf - -C "$C" --exclude='*.lock' --exclude='.build-*' "${paths[@]}" | gzip -1 | split -b ${MB}M -d -a 2 - .carry/parts/cache.tgz.
n=0; for f in .carry/parts/cache.tgz.*; do d=.carry/p$(printf %02d $n); mkdir -p $d; mv "$f" $d/; n=$((n+1)); done
rmdir .carry/parts
(cd .carry && sha256sum p*/cache.tgz.* | sed 's| p[0-9]*/| |' > p$(printf %02d $((n-1)))/pieces.sha256.flat)
du -sh .carry; echo "$n pieces: .carry/p00 .. .carry/p$(printf %02d $((n-1)))"
