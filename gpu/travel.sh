#!/bin/bash
# What travels with a device call: the tracked tree (64 MiB a call, carried files included). The committed data,
# notebooks and figures (~50 MB, the heads' weights in parts among them) stay here while the GPU jobs run: they
# need the package and gpu/ only (models, workloads and the heads come staged in the cache's pieces).
#   bash gpu/travel.sh light      data/ notebooks/ figures/ out of the index and into .aside/ (untracked, ignored)
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
    mkdir .aside && git rm -r --cached -q $P && mv $P .aside/ ;;
  restore)
    [ -d .aside ] || { echo "nothing aside"; exit 0; }
    for p in $P; do [ -e .aside/$p ] && { [ -e $p ] && { echo "$p exists here and in .aside/: resolve by hand"; exit 2; }; mv .aside/$p .; }; done
    rmdir .aside && git reset -q -- $P ;;
  size) ;;
  *) echo "usage: gpu/travel.sh light|restore|size"; exit 2 ;;
esac
{ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "travels: %.1f MiB\n", $1/1048576}'
