"""The live job (gpu/live_job.sh): its stages, and the paths its run takes on the CPU: the agreement path (profiled
acceptance -> per-step prediction) on the committed SmolLM2 run, a rotated engine's Latin square, the profiles a
run leaves."""
import json
import subprocess
from pathlib import Path

from spec_repro.engines.vllm import agreement as A

ROOT = Path(__file__).resolve().parents[1]


def test_live_job_parses_and_names_its_stages():
    assert subprocess.run(["bash", "-n", "gpu/live_job.sh"], cwd=ROOT).returncode == 0
    r = subprocess.run(["bash", "gpu/live_job.sh", "nothing"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout.split()[1:] == ["vllm", "piece", "setup", "start", "run", "v2start", "v2run", "stop", "status",
                                    "pack", "send"]


def test_every_gpu_job_script_parses():
    scripts = sorted((ROOT / "gpu").glob("*.sh"))
    assert len(scripts) >= 6
    for sh in scripts:
        assert subprocess.run(["bash", "-n", str(sh)], cwd=ROOT).returncode == 0, sh.name


def test_agreement_prompts_are_the_workloads_first_requests():
    prompts = [json.loads(x) for x in open(A.AGREEMENT_PROMPTS)]
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
    acc = A.profile_outputs(prompts, {k: outputs[k] for k in keys}, {"ngram": NgramProposer(3, 7)}, k_max=8)
    res = agreement(steps, prompts, outputs, k=8, predictor=A.predictor_from_acc(acc["ngram"], prompts))
    assert res["steps"] > 1000 and res["accepted_agree"] == res["steps"]
    # a wrong prediction shows: shifting acceptance by one position breaks agreement
    shifted = {k: [a[1:] + a[-1:], d] for k, (a, d) in acc["ngram"].items()}
    bad = agreement(steps, prompts, outputs, k=8, predictor=A.predictor_from_acc(shifted, prompts))
    assert bad["accepted_agree"] < res["steps"]


def test_predictor_without_draft_lengths_drafts_k():
    pred = A.predictor_from_acc({"x": [[3, 1, 6], []]}, {"x": [5, 6, 7]})
    assert pred([5, 6, 7], [1, 2, 3], [1, 2, 3], k=4) == {1: (4, 2), 2: (4, 0), 3: (4, 4)}


def test_a_rotated_engine_runs_every_policy_in_a_latin_square_and_names_it_on_every_run(tmp_path):
    """``jobs.rotated_spec`` / ``_rotated_runs`` on a fake engine: per shape one untimed warm-up per policy, then
    the timed runs in ``rotated_order`` (each policy once in each position over its 4 repeats), each run recorded
    with the single-policy configuration it stands for, so ``live.load`` (runs) and ``live.step_configs`` (step
    rows, by run id) file it under that policy: ``eagle`` for off, the policy otherwise."""
    import types

    from spec_repro.engines.vllm import jobs as J
    from spec_repro.engines.vllm import live
    from spec_repro.engines.vllm.engine import VLLMConfig

    spec = J.rotated_spec("H", model_dir="M")
    pols = J.ROTATE_POLICIES
    assert spec["name"] == "hybrid-default-rotate" and spec["config"]["hybrid_rotate"] == list(pols)
    task = spec["tasks"][0]
    assert task["repeats"] == len(pols)
    one = J.hybrid_specs("H", model_dir="M", methods=("eagle",), repeats=4)[0]
    assert abs((J.estimate_seconds(spec) - 70) - len(pols) * (J.estimate_seconds(one) - 70)) < 1e-6
    order = J.rotated_order(pols, 4)
    for i in range(len(pols)):              # position i of the repeats: every policy once
        assert sorted(p for r, p in order if order.index((r, p)) % len(pols) == i) == sorted(pols)

    calls, recs = [], []

    class Eng:
        cfg = VLLMConfig(**spec["config"], step_log=str(tmp_path / "s.jsonl"))

        def set_hybrid(self, p):
            calls.append(("switch", p))

        def run_prompts(self, prompts, max_tokens, *, run_id, record=True, keep_outputs=False, label=""):
            calls.append(("run", run_id, record))
            return types.SimpleNamespace(batch_size=len(prompts), run_id=run_id)

    chunks = [[types.SimpleNamespace(prompt_token_ids=[1, 2], id=f"q{i}")] for i in range(2)]
    J._rotated_runs(Eng(), task, lambda r, **kw: recs.append((r.run_id, kw)), "code-edit", 1, chunks, list(pols))
    warm = calls[:2 * len(pols)]
    assert warm == [x for p in pols for x in (("switch", p), ("run", f"code-edit-b1-c0@{p}-r-1", False))]
    timed = [c for c in calls[2 * len(pols):] if c[0] == "switch"]
    assert [p for _s, p in timed] == [p for _r, p in order]
    assert len(recs) == len(order) * len(chunks)
    labels = {rid: J.config_label(kw["config"]) for rid, kw in recs}
    assert labels["code-edit-b1-c1@off-r0"] == "eagle" and labels["code-edit-b1-c0@idle-r3"] == "idle"
    assert all(kw["hybrid_now"] in rid and kw["config"]["rotated"] == list(pols) for rid, kw in recs)
    ids = [rid for rid, _ in recs]
    assert list(live.step_configs(ids, spec["config"])) == [labels[r] for r in ids]
    assert set(live.step_configs(["x"], {"method": "eagle"}, "s")) == {"eagle"}

    res = tmp_path / "raw" / "qwen5"
    res.mkdir(parents=True)
    with open(res / "results.jsonl", "w") as f:
        f.write(json.dumps({"kind": "engine", "spec": spec["name"], "config": spec["config"]}) + "\n")
        for rid, kw in recs:
            f.write(json.dumps({"kind": "run", "spec": spec["name"], "run_id": rid, "batch_size": 1, **{
                k: v for k, v in kw.items() if k != "keys"}}) + "\n")
    runs, _steps, _e = live.load(tmp_path / "raw")
    assert sorted(set(runs["config"])) == sorted({"eagle", *pols[1:]})
    assert (runs.groupby("config").size() == 4 * len(chunks)).all()


def test_device_trace_reads_the_latest_profile_of_the_workload(tmp_path):
    """``device_trace``: a code-edit profile never matches another workload's (``hybrid_trace_sharegpt_s8`` starts
    with ``hybrid_trace_s``), and s10 is later than s9 (by number, not by name)."""
    from spec_repro.engines.vllm import live

    for n in ("hybrid_trace_s9.jsonl", "hybrid_trace_s10.jsonl", "hybrid_trace_sharegpt_s8.jsonl",
              "hybrid_trace_sharegpt_s10.jsonl", "hybrid_trace.jsonl"):
        (tmp_path / n).write_text("")
    assert live.device_trace(tmp_path) == tmp_path / "hybrid_trace_s10.jsonl"
    assert live.device_trace(tmp_path, "sharegpt") == tmp_path / "hybrid_trace_sharegpt_s10.jsonl"
    (tmp_path / "hybrid_trace_s10.jsonl").unlink()
    (tmp_path / "hybrid_trace_sharegpt_s10.jsonl").unlink()
    assert live.device_trace(tmp_path) == tmp_path / "hybrid_trace_s9.jsonl"
    assert live.device_trace(tmp_path, "sharegpt") == tmp_path / "hybrid_trace_sharegpt_s8.jsonl"
    assert live.device_trace(tmp_path, "mt-bench") is None
