"""The GPU plans are data (gpu/plans/*.json): each lists its stages with their seconds, and each fits its lease."""
import json
from pathlib import Path

import pytest

PLANS = Path(__file__).resolve().parents[1] / "gpu" / "plans"


def _seconds(stages):
    return sum(s.get("seconds", s.get("seconds_each", 0) * s.get("calls", 1)) for s in stages)


@pytest.mark.parametrize("name", ["head"])
def test_a_plan_fits_its_lease(name):
    plan = json.loads((PLANS / f"{name}.json").read_text())
    for p in (plan, plan.get("next")):
        if p is None:
            continue
        assert p["stages"] and all(s.get("seconds", s.get("seconds_each")) for s in p["stages"]), p["stages"]
        assert _seconds(p["stages"]) <= p["limit_s"], (name, _seconds(p["stages"]), p["limit_s"])


def test_the_head_plan_is_what_ran():
    """The head's plan prices its training stage with the record of the run that made the committed head."""
    plan = json.loads((PLANS / "head.json").read_text())
    rec = json.loads((PLANS.parents[1] / "data/heads/qwen2.5-coder-1.5b-eagle/TRAINING.json").read_text())
    train = next(s for s in plan["stages"] if s["stage"] == "train")
    assert abs(train["seconds"] - rec["total_wall_s"]) < 5
    assert str(rec["steps_done"]) in train["what"].replace(",", "")
