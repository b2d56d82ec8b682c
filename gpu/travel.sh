#!/bin/bash
# What travels with a device call: the tracked tree (64 MiB a call, carried files included). The committed data,
# notebooks and figures (~150 MB, the heads' weights in parts among them) stay here while the GPU jobs run: they
# need the package, gpu/, the heads' JSON (config, parts manifest, record), the model configs and the job table
# (data/gpu/jobs.json) only (models, workloads and the heads' weights come staged in the cache's pieces: gpu/stage_cache.sh).
#   bash gpu/travel.sh light      the rest of data/ notebooks/ figures/ out of the index and into .aside/ (ignored)
#   bash gpu/travel.sh restore    everything back where it was, the index as HEAD has it
#   bash gpu/travel.sh size       what would travel now (MiB)
# Never commit between light and restore: the index then lacks those folders.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
P="data notebooks figures"
grep -qx '/.aside/' .git/info/exclude 2>/dev/null || echo '/.aside/' >> .git/info/exclude
case "${1:-}" in
  light)
    [ -d .aside ] && { echo ".aside/ exists: restore first"; exit 2; }
    git diff --quiet -- $P && git diff --cached --quiet -- $P || { echo "uncommitted changes under $P: commit first"; exit 2; }
    mkdir .aside
    git ls-files -z $P | grep -zv -E '^data/heads/.*\.json$|^data/gpu/configs/|^data/gpu/jobs\.json$' > .aside/.list
    xargs -0 git rm --cached -q -- < .aside/.list
    while IFS= read -r -d '' f; do mkdir -p ".aside/$(dirname "$f")" && mv "$f" ".aside/$f"; done < .aside/.list ;;
  restore)
    [ -d .aside ] || { echo "nothing aside"; exit 0; }
    while IFS= read -r -d '' f; do
      [ -e "$f" ] && { echo "$f exists here and in .aside/: resolve by hand"; exit 2; }
      mkdir -p "$(dirname "$f")" && mv ".aside/$f" "$f"; done < .aside/.list
    xargs -0 git reset -q -- < .aside/.list && rm -rf .aside ;;
  size) ;;
  *) echo "usage: gpu/travel.sh light|restore|size"; exit 2 ;;
esac
{ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "travels: %.1f MiB\n", $1/1048576}'
