"""Every committed vLLM folder's MANIFEST.json lists every file beside it and nothing that is not there, each with
its bytes' sha256 (a lock file was once listed in all of them)."""
import json

import pytest

from spec_repro.paths import data_dir
from spec_repro.provenance import sha256_file

FOLDERS = sorted(p.parent for p in (data_dir() / "gpu").glob("*/MANIFEST.json"))


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
    assert (folder / "README.md").is_file()


def test_there_are_folders_to_check():
    assert {"live", "live5", "draftk", "hostdrift"} <= {p.name for p in FOLDERS}
