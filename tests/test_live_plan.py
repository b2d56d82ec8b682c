"""Issue 18's GPU session (gpu/live_job.sh, engines.vllm.session): its plan fits the budget, every engine runs once
and in priority order; the agreement path (profiled acceptance -> per-step prediction) on the committed SmolLM2 run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_repro.engines.vllm import session as S
from spec_repro.engines.vllm.jobs import hybrid_specs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plan_out():
    r = subprocess.run(["bash", "gpu/live_job.sh", "plan"], cwd=ROOT, capture_output=True, text=True,
                       env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=120)
    return r


def test_plan_fits_and_prints_total(plan_out):
    assert plan_out.returncode == 0, plan_out.stderr
    pl = S.plan()
    assert pl["fits"] and pl["total_s"] <= S.PLAN_LIMIT_S < S.BUDGET_S
    assert f"{pl['total_s']:.0f} s  total" in plan_out.stdout
    for e in (e for row in pl["stages"] for e in row.get("engines", [])):
        assert e["spec"] in plan_out.stdout


def test_plan_fails_over_budget():
    r = subprocess.run(["bash", "gpu/live_job.sh", "plan", "--budget", "600"], cwd=ROOT, capture_output=True,
                       text=True, env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                       timeout=120)
    assert r.returncode == 1 and "OVER BUDGET" in r.stderr


def test_every_engine_once_in_priority_order():
    names = [s["name"] for p in S.PARTS for s in S.part_specs(p)]
    assert len(names) == len(set(names))
    assert list(S.PARTS) == ["a", "b", "c", "d"]
    # (a) agreement first: EAGLE on the real head before anything else, n-gram and the draft model beside it
    a = S.part_specs("a", head="H", draft_dir="D")
    assert [s["config"]["method"] for s in a] == ["eagle", "ngram", "draft_model"]
    assert all(s["tasks"][0]["type"] == "prompts" and s["tasks"][0]["detail"] for s in a)
    assert a[0]["config"]["draft"] == "H" and a[2]["config"]["draft"] == "D"
    # (a)+(b) hold exactly the hybrid job's configurations on code-edit, each once
    hy = {s["name"]: s for s in hybrid_specs("H", model_dir="M", k=S.K, workloads=S.HYBRID_WORKLOADS,
                                             methods=("none", "ngram", "eagle", "pr24344", "pr24344-skip"))}
    ab = {s["name"]: s for p in "ab" for s in S.part_specs(p, head="H", model_dir="M")}
    assert set(hy) <= set(ab)
    for n, s in hy.items():
        assert ab[n]["config"] == s["config"] and ab[n]["tasks"][-1] == s["tasks"][0]
    # (c) the same Llama-3.1-8B dims as the committed dummy-weight jobs, the two engine configurations
    c = S.part_specs("c")
    committed = json.loads((ROOT / "data/gpu/jobs.json").read_text())["specs"]["llama8b-none-s3"]["config"]
    assert {s["engine_config"] for s in c} == {"default", "study-like"}
    for s in c:
        assert Path(s["config"]["model"]) == ROOT / committed["model"]
        assert s["config"]["load_format"] == "dummy" and s["tasks"][0]["batch_sizes"] == [1, 16, 64, 256]
        assert s["tasks"][0]["prompt_len"] == 512 and s["tasks"][0]["max_tokens"] == 256
        assert s["tasks"][0]["repeats"] >= 3 and s["tasks"][0]["warm_each"]
    # the live_job.sh run stage runs the parts in this order
    run = (ROOT / "gpu/live_job.sh").read_text()
    assert "part a qwen; part b qwen; part c llama8b; part d draftk" in run


def test_agreement_prompts_are_the_workloads_first_requests():
    prompts = [json.loads(x) for x in open(S.AGREEMENT_PROMPTS)]
    assert len(prompts) == 200 and len({p["key"] for p in prompts}) == 200
    assert {p["dataset"] for p in prompts} == {"code-edit", "sharegpt", "humaneval", "mt-bench", "gsm-symbolic"}
    assert all(p["eos"] and max(map(len, [p["prompt_token_ids"]])) <= 1024 for p in prompts)


def test_profiled_acceptance_predicts_the_committed_smollm2_steps():
    """The path `predict` + `agreement` take on the GPU, here with n-gram on the committed SmolLM2 run: vLLM's
    per-request steps vs the profiler's acceptance on vLLM's own outputs, read by predictor_from_acc."""
    from spec_repro.engines.vllm.agreement import agreement, load_smollm2_steps
    from spec_repro.proposers.ngram import NgramProposer

    steps, prompts, outputs = load_smollm2_steps(ROOT / "data/gpu")
    keys = sorted(steps)[:60]
    steps = {k: steps[k] for k in keys}
    acc = S.profile_outputs(prompts, {k: outputs[k] for k in keys}, {"ngram": NgramProposer(3, 7)}, k_max=8)
    res = agreement(steps, prompts, outputs, k=8, predictor=S.predictor_from_acc(acc["ngram"], prompts))
    assert res["steps"] > 1000 and res["accepted_agree"] == res["steps"]
    # a wrong prediction shows: shifting acceptance by one position breaks agreement
    shifted = {k: [a[1:] + a[-1:], d] for k, (a, d) in acc["ngram"].items()}
    bad = agreement(steps, prompts, outputs, k=8, predictor=S.predictor_from_acc(shifted, prompts))
    assert bad["accepted_agree"] < res["steps"]


def test_predictor_without_draft_lengths_drafts_k():
    pred = S.predictor_from_acc({"x": [[3, 1, 6], []]}, {"x": [5, 6, 7]})
    assert pred([5, 6, 7], [1, 2, 3], [1, 2, 3], k=4) == {1: (4, 2), 2: (4, 0), 3: (4, 4)}
