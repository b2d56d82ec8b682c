"""The GPU plans are data (gpu/plans/*.json): each lists its stages with their seconds, and each fits its lease."""
import json
from pathlib import Path

import pytest

PLANS = Path(__file__).resolve().parents[1] / "gpu" / "plans"


def _seconds(stages):
    return sum(s.get("seconds", s.get("seconds_each", 0) * s.get("calls", 1)) for s in stages)


def _engine_specs(plan):
    """The engine specs a plan's ``engines`` stage runs: the grid of the job the plan is named for."""
    from spec_repro.engines.vllm import v2grid

    assert plan["name"] == "v2grid", f"plan {plan['name']!r} has an engines stage but no job to build its specs"
    return v2grid.grid_specs("HEAD", model_dir="MODEL", draft_dir="DRAFT")


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.json")), ids=lambda p: p.stem)
def test_every_plan_fits_its_lease_priced_from_its_own_seconds(path):
    """Every stage of every plan (and of its ``next``) carries its seconds, or, for a stage that runs engines, the
    plan's ``engine_seconds`` prices each engine; the total of what runs fits the plan's ``limit_s``."""
    plan = json.loads(path.read_text())
    assert plan["name"] == path.stem
    for p in (plan, plan.get("next")):
        if p is None:
            continue
        fixed = [s for s in p["stages"] if not s.get("engines")]
        assert p["stages"] and all(s.get("seconds", s.get("seconds_each")) for s in fixed), p["stages"]
        total = _seconds(fixed)
        if len(fixed) < len(p["stages"]):
            from spec_repro.engines.vllm.v2grid import plan_rows

            assert p["engine_seconds"]["start_s"] > 0 and p["engine_seconds"]["per_workload_s"]
            priced = plan_rows(_engine_specs(p), p)
            assert abs(priced["total_s"] - total - sum(r["seconds"] for r in priced["rows"]
                                                       if r["stage"].startswith("engine ") and not r["deferred"])) < 1e-6
            total = priced["total_s"]
        assert total <= p["limit_s"], (path.name, total, p["limit_s"])


def test_the_head_plan_is_what_ran():
    """The head's plan prices its training stage with the record of the run that made the committed head."""
    plan = json.loads((PLANS / "head.json").read_text())
    rec = json.loads((PLANS.parents[1] / "data/heads/qwen2.5-coder-1.5b-eagle/TRAINING.json").read_text())
    train = next(s for s in plan["stages"] if s["stage"] == "train")
    assert abs(train["seconds"] - rec["total_wall_s"]) < 5
    assert str(rec["steps_done"]) in train["what"].replace(",", "")


def test_what_travels_holds_what_the_gpu_jobs_read():
    """gpu/travel.sh light keeps out of a device call every committed data file but those the GPU jobs read: the
    job table (``jobs.JOBS_FILE``, read when the job module loads), the model configs and the heads' JSON."""
    import re
    import subprocess

    from spec_repro.engines.vllm import jobs

    root = PLANS.parents[1]
    kept = re.search(r"grep -zv -E '([^']+)'", (root / "gpu" / "travel.sh").read_text()).group(1)
    files = subprocess.run(["git", "ls-files", "data"], cwd=root, capture_output=True, text=True).stdout.split()
    travels = {f for f in files if re.search(kept, f)}
    assert str(jobs.JOBS_FILE.relative_to(root)) in travels
    assert any(f.startswith("data/gpu/configs/") for f in travels)
    assert "data/heads/qwen2.5-coder-1.5b-eagle/model.safetensors.parts.json" in travels
    assert not any(f.endswith((".parquet", ".png")) or ".part" in f.rsplit("/", 1)[-1].replace(".parts.json", "")
                   for f in travels)
