"""Every committed vLLM folder's MANIFEST.json lists every file beside it and nothing that is not there, each with
its bytes' sha256 (a lock file was once listed in all of them). The V1-runner studies (data/gpu/v1-runner/) share
ONE README, which names every one of them."""
import json

import pytest

from spec_repro.paths import V1_STUDIES, data_dir, v1_runner_dir
from spec_repro.provenance import sha256_file

GPU = data_dir() / "gpu"
FOLDERS = sorted(p.parent for g in ("*/MANIFEST.json", "v1-runner/*/MANIFEST.json") for p in GPU.glob(g))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_manifest_verifies_the_files_beside_it(folder):
    man = json.loads((folder / "MANIFEST.json").read_text())
    files = {e["file"]: e for e in man.values() if isinstance(e, dict) and "file" in e}
    on_disk = {p.name for p in folder.iterdir() if p.is_file() and p.name not in ("MANIFEST.json", "README.md")
               and not p.name.startswith(".")}
    assert not [f for f in files if f.startswith(".")], "a lock or hidden file is listed"
    assert on_disk <= set(files), "a file beside the manifest is not in it"
    assert [f for f in files if not (folder / f).is_file()] == [], "the manifest lists a file that is not there"
    bad = [f for f, e in files.items() if e.get("sha256") and sha256_file(folder / f) != e["sha256"]]
    assert bad == []
    if folder.parent == v1_runner_dir():          # the V1-runner studies: one README above them
        assert not (folder / "README.md").exists() and (folder.parent / "README.md").is_file()
    else:
        assert (folder / "README.md").is_file()


def test_there_are_folders_to_check():
    assert set(V1_STUDIES) <= {p.name for p in FOLDERS} and "v2grid" in {p.name for p in FOLDERS}


def test_the_v1_runner_studies_have_one_readme_that_names_each():
    root = v1_runner_dir()
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("README*")) == ["README.md"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(V1_STUDIES)
    text = (root / "README.md").read_text()
    assert [s for s in V1_STUDIES if f"`{s}/`" not in text] == []
    assert "V1 runner (forced)" in text


def test_the_live_folder_is_the_v2_run_and_its_raw_records_verify():
    """data/gpu/live holds the V2-runner hybrid run (no V1-runner study): every engine V2-forced but vLLM's n-gram
    (V1, its only runner); the raw records it was made from are beside it under raw/, each file's sha256 listed."""
    import pandas as pd

    runs = pd.read_csv(GPU / "live" / "runs.csv")
    assert set(zip(runs["config"] == "ngram", runs["engine_config"])) == {(False, "v2-forced"), (True, "v1-forced")}
    for name in ("v2hybrid-h100-grid", "v2hybrid-h100"):          # the grid, and the lossless gate beside it
        raw = GPU / "raw" / name
        sums = dict(line.split()[::-1] for line in (raw / "SHA256SUMS").read_text().splitlines())
        on_disk = {"./" + p.relative_to(raw).as_posix() for p in raw.rglob("*")
                   if p.is_file() and p.name != "SHA256SUMS"}
        assert set(sums) == on_disk and all(sha256_file(raw / f) == h for f, h in sums.items())
    assert (runs["stage"] == "grid").sum() > 400 and (runs["stage"] == "overhead").sum() > 300   # whole grid, 20 reps
