"""Issue 18's GPU session (gpu/live_job.sh, engines.vllm.session): its plan fits the budget, every engine runs once
and in priority order; the agreement path (profiled acceptance -> per-step prediction) on the committed SmolLM2 run."""
import json
import os
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


# ---- the second session (parts e-i) --------------------------------------------------------------------------
def test_second_plan_fits_and_drops_the_lowest_priority_parts():
    r = subprocess.run(["bash", "gpu/live_job.sh", "plan", "--session", "2"], cwd=ROOT, capture_output=True,
                       text=True, env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                       timeout=120)
    assert r.returncode == 0, r.stderr
    pl = S.plan(session=2)
    assert pl["fits"] and pl["total_s"] <= S.PLAN_LIMIT_S
    assert pl["total_s"] == sum(row["seconds"] for row in pl["stages"])
    assert list(S.SESSION_PARTS[2]) == ["e", "i", "f", "g", "h"]
    # what runs is a prefix of the priority order; the rest is deferred, and would not have fitted
    n = len(pl["parts"])
    assert pl["parts"] == ["e", "i", "f"] and pl["dropped"] == ["g", "h"] == list(S.SESSION_PARTS[2][n:])
    nxt = S._part_row("h", 2)["seconds"]
    assert pl["total_s"] + nxt > S.PLAN_LIMIT_S
    assert all(any(d.startswith(f"part {p} ") for d in pl["deferred"]) for p in pl["dropped"])
    # staging and setup as measured; every engine priced from a measured one (or the calibrated model)
    assert [row["seconds"] for row in pl["stages"][:2]] == [254, 255]
    for e in (e for row in pl["stages"] for e in row.get("engines", [])):
        assert e["spec"] in r.stdout and e["basis"].split()[0] in S.MEASURED_S
    assert f"{pl['total_s']:.0f} s  total" in r.stdout and 'PARTS="e i f"' in r.stdout
    # a smaller limit drops more, in the same order; none fitting is over budget
    assert S.plan(1000, session=2)["parts"] == ["e"]
    r = subprocess.run(["bash", "gpu/live_job.sh", "plan", "--session", "2", "--budget", "600"], cwd=ROOT,
                       capture_output=True, text=True,
                       env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 1 and "OVER BUDGET: no part fits" in r.stderr
    assert S.plan()["session"] == 1 and S.plan()["total_s"] == S.plan(session=1)["total_s"]    # a-d unchanged


def test_second_session_specs_are_well_formed(tmp_path):
    from spec_repro.engines.vllm.engine import VLLMConfig, engine_env, engine_kwargs

    parts = {p: S.part_specs(p, head="H", model_dir="M") for p in S.SESSION_PARTS[2]}
    names = [s["name"] for ss in parts.values() for s in ss]
    first = {s["name"] for p in S.PARTS for s in S.part_specs(p)}
    assert len(names) == len(set(names)) and not set(names) & first and all(n.endswith("-s2") for n in names)
    for s in (s for ss in parts.values() for s in ss):
        cfg = VLLMConfig(**s["config"], step_log=str(tmp_path / "x.jsonl") if s.get("instrumented", True) else None)
        engine_kwargs(cfg)
        env = engine_env(cfg)
        # padded specs carry the option (and only they); their names say so
        assert bool(s["config"].get("hybrid_pad")) == ("-pad" in s["name"]) == ("SPEC_REPRO_HYBRID_PAD" in env)
        assert s["config"]["k"] == S.K or s["name"].startswith("draftk-")
    e = {s["name"]: s["config"] for s in parts["e"]}
    assert list(e) == ["hybrid-default-none-s2", "hybrid-default-pr24344-pad-s2",
                       "hybrid-default-pr24344-skip-pad-s2", "hybrid-default-ngram-pad-s2"]
    assert [c.get("hybrid") for c in e.values()] == [None, "pr24344", "pr24344-skip", "ngram-only"]
    assert all(s["tasks"][0]["workloads"] == ["code-edit"] and s.get("instrumented", True) for s in parts["e"])
    # f: EAGLE on vLLM's own runner choice and no SD, both without the plugin; no SD is e's engine, untimed
    f = {s["name"]: s for s in parts["f"]}
    vd, ni = f["hybrid-vllm-default-eagle-s2"], f["hybrid-default-none-noinst-s2"]
    assert vd["config"]["model_runner"] == "default" and vd["instrumented"] is False and "hybrid" not in vd["config"]
    assert "VLLM_USE_V2_MODEL_RUNNER" not in engine_env(VLLMConfig(**vd["config"]))
    assert ni["instrumented"] is False and ni["config"] == e["hybrid-default-none-s2"]
    # g: sharegpt for the padded hybrid, EAGLE and no SD (the lossless reference)
    g = S.part_specs("g", head="H", model_dir="M", best="ngram-pad")
    assert [s["name"] for s in g] == ["hybrid-default-ngram-pad-sharegpt-s2", "hybrid-default-eagle-sharegpt-s2",
                                      "hybrid-default-none-sharegpt-s2"]
    assert all(s["tasks"][0]["workloads"] == ["sharegpt"] for s in g) and g[0]["config"]["hybrid_pad"]
    with pytest.raises(ValueError, match="part e's"):
        S.part_specs("g", best="pr24344")
    assert [s["config"]["k"] for s in parts["h"]] == [1, 3, 8, 12]
    assert [s["config"].get("hybrid") for s in parts["i"]] == ["eagle-only", None]


def test_best_padded_is_the_fastest_against_no_sd(tmp_path):
    def run(cfg, b, n, w):
        return json.dumps({"kind": "run", "task": "hybrid", "workload": "code-edit", "batch_size": b,
                           "config": {"step_log": "s.jsonl", **cfg}, "output_tokens": n, "wall_s": w})
    pad = lambda pol: {"method": "eagle", "hybrid": pol, "hybrid_pad": True}  # noqa: E731
    lines = [run({"method": "none"}, 1, 100, 1.0), run({"method": "none"}, 64, 6400, 1.0),
             # pr24344-pad: 2x at bs 1, 1x at bs 64 (mean 1.5); ngram-pad: 1.2x and 2x (mean 1.6)
             run(pad("pr24344"), 1, 100, 0.5), run(pad("pr24344"), 64, 6400, 1.0),
             run(pad("ngram-only"), 1, 120, 1.0), run(pad("ngram-only"), 64, 6400, 0.5),
             run({"method": "eagle", "hybrid": "pr24344"}, 1, 1000, 1.0),     # unpadded: not a candidate
             run({"method": "none", "step_log": None}, 1, 50, 1.0)]           # untimed no SD: not the reference
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert S.best_padded(tmp_path / "results.jsonl") == "ngram-pad"
    assert S.best_padded(tmp_path / "missing.jsonl") == S.DEFAULT_BEST


def test_live_job_runs_the_chosen_parts(tmp_path):
    """``PARTS="e g" bash gpu/live_job.sh run`` runs those parts in order (each with its results folder and
    lossless), unset PARTS the first session's a-d; on a stand-in python that records its calls."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/bash\nif [ \"$1\" = -c ]; then echo /m; else echo \"$*\" >> " + str(tmp_path / "calls")
                    + "; fi\n")
    fake.chmod(0o755)

    def calls(parts):
        (tmp_path / "calls").write_text("")
        res = tmp_path / f"res_{parts or 'none'}".replace(" ", "")
        env = {"PY": str(fake), "PATH": "/usr/bin:/bin", "RES": str(res), "END": str(10 ** 10)}
        if parts:
            env["PARTS"] = parts
        r = subprocess.run(["bash", "gpu/live_job.sh", "run"], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and "PIPE_FINISHED" in r.stdout, r.stderr
        got = [ln.split()[2:5] for ln in (tmp_path / "calls").read_text().splitlines()]
        return got, sorted(p.name for p in res.glob("done_*"))

    got, done = calls("e g")
    lossless = ["lossless", "--out", str(tmp_path / "res_eg" / "qwen2")]
    assert got == [["run", "e", "--out"], lossless, ["run", "g", "--out"], lossless]
    assert done == ["done_e", "done_g"]
    got, done = calls("")
    assert [c[1] for c in got if c[0] == "run"] == ["a", "b", "c", "d"] and done == [f"done_{p}" for p in "abcd"]


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


def test_the_sixth_sessions_parts_rotate_one_engine_and_file_their_results_in_one_folder(tmp_path):
    """Parts m and s (``gpu/live_job.sh run5``): the rotated EAGLE engine first (what the Must shows need), then
    no SD and n-gram, every name distinct across the two parts; the script's pdir files both under qwen5 and runs
    the lossless check after each."""
    m, s = S.part_specs("m", "H", "M"), S.part_specs("s", "H", "M")
    assert [x["name"] for x in m] == ["hybrid-default-rotate-s5", "hybrid-default-none-s5", "hybrid-default-ngram-s5"]
    assert len({x["name"] for x in m + s}) == 6
    assert m[0]["config"]["hybrid_rotate"] == ["off", "idle", "gpu-pr24344", "gpu-eagle-only"]
    assert {x["tasks"][0]["workloads"][0] for x in m} == {"code-edit"} and s[0]["tasks"][0]["workloads"] == ["sharegpt"]
    assert all(x["tasks"][0]["repeats"] == S.ROTATED_REPEATS for x in m + s)
    env = {**os.environ, "RES": str(tmp_path)}
    for p in "ms":
        r = subprocess.run(["bash", "-c", f"source <(sed -n '/^pdir()/,/^detach()/p' gpu/live_job.sh | head -n -1); "
                            f"pdir {p}"], cwd=ROOT, capture_output=True, text=True, env=env)
        assert r.stdout.strip() == "qwen5", r.stderr
    run = (ROOT / "gpu/live_job.sh").read_text()
    assert "b|e|f|g|k|m|s|x|u|v|z|y|o|l|q) $PY -m spec_repro.engines.vllm.jobs lossless" in run
    assert "for p in ${PARTS:-m s}; do part $p qwen5; done" in run


def test_the_drafting_sweep_plan_fits_and_runs_part_w_once(tmp_path):
    """Session 3 (part w, ``gpu/live_job.sh start7``): EAGLE at k = 1, 3, 5, 8, 12 on both targets' dims, dummy
    weights (no cache staged: only vLLM), every head a committed config; the plan fits; ``run7`` runs part w once
    into draftk6 and marks it, and a second run skips it (resumable)."""
    specs = S.part_specs("w")
    assert len(specs) == 2 * len(S.DRAFT_KS) and len({s["name"] for s in specs}) == len(specs)
    for s in specs:
        c = s["config"]
        assert c["method"] == "eagle" and c["load_format"] == "dummy" and c["k"] in S.DRAFT_KS
        assert (ROOT / c["model"] / "config.json").is_file() and (ROOT / c["draft"] / "config.json").is_file()
        assert json.loads((ROOT / c["draft"] / "config.json").read_text())["vocab_size"] == \
            s["tasks"][0]["vocab_size"]
    assert {(s["config"]["name"], s["config"]["k"]) for s in specs} == {
        (n, k) for n in ("qwen2.5-coder-1.5b", "llama31-8b") for k in S.DRAFT_KS}
    # both targets' end points first: a deadline that cuts the sweep still leaves d0 and d1 for each
    assert {(s["config"]["name"], s["config"]["k"]) for s in specs[:4]} == {
        (n, k) for n in ("qwen2.5-coder-1.5b", "llama31-8b") for k in (1, 12)}
    pl = S.plan(session=3)
    assert pl["fits"] and pl["parts"] == ["w"] and pl["total_s"] < S.PLAN_LIMIT_S
    fake = tmp_path / "py"
    fake.write_text("#!/bin/bash\necho \"$*\" >> " + str(tmp_path / "calls") + "\n")
    fake.chmod(0o755)
    env = {"PY": str(fake), "PATH": "/usr/bin:/bin", "RES": str(tmp_path / "res"), "END": str(10 ** 10)}
    for _ in range(2):
        r = subprocess.run(["bash", "gpu/live_job.sh", "run7"], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and "PIPE_FINISHED" in r.stdout, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].split()[2:6] == ["run", "w", "--out", str(tmp_path / "res" / "draftk6")]
    assert (tmp_path / "res" / "done_w").exists()


def test_the_seventh_sessions_plan_fits_and_run8_runs_part_s_with_its_own_head_once(tmp_path):
    """Session 4 (``gpu/live_job.sh start8``): part s on sharegpt with a head trained in the run, priced by the
    fifth session's measured part m; ``run8`` trains (skipped when the head is there), runs part s into qwen6 with
    that head, profiles sharegpt's no-SD outputs with it, then part x (adaptive-rule, only in the time left: over
    the plan limit, so the plan defers it) and code-edit's profile; a second run repeats nothing."""
    pl = S.plan(session=4)
    assert pl["fits"] and pl["parts"] == ["s"] and pl["dropped"] == ["x"] and pl["total_s"] < S.PLAN_LIMIT_S
    (x,) = S.part_specs("x", "H", "M")
    assert x["name"] == "hybrid-default-adaptive-rule-pad-sharegpt-s8" and x["tasks"][0]["repeats"] == 1
    assert x["config"]["hybrid"] == "adaptive-rule" and x["config"]["hybrid_pad"] and x["config"]["draft"] == "H"
    assert x["config"]["hybrid_cost_model"] == S.ADAPTIVE_COST and x["tasks"][0]["workloads"] == ["sharegpt"]
    assert [e["seconds"] for e in pl["stages"][-1]["engines"]] == [307, 101, 140]    # part m's, measured
    assert all(w == ["sharegpt"] for w in (e["workloads"] for e in pl["stages"][-1]["engines"]))
    res = tmp_path / "res"
    head = res / "qwen6" / "head"
    head.mkdir(parents=True)
    (head / "TRAINING.json").write_text("{}")
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"w")
    fake = tmp_path / "py"
    fake.write_text("#!/bin/bash\necho \"$*\" >> " + str(tmp_path / "calls") + "\n")
    fake.chmod(0o755)
    env = {"PY": str(fake), "PATH": "/usr/bin:/bin", "RES": str(res), "END": str(10 ** 10)}
    for _ in range(2):
        r = subprocess.run(["bash", "gpu/live_job.sh", "run8"], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and "PIPE_FINISHED" in r.stdout, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    runs = [c for c in calls if " run s " in f" {c} "]
    assert len(runs) == 1 and f"--out {res / 'qwen6'}" in runs[0] and f"--head {head}" in runs[0]
    xs = [c for c in calls if " run x " in f" {c} "]
    assert len(xs) == 1 and f"--out {res / 'qwen6'}" in xs[0] and f"--head {head}" in xs[0]
    assert calls.index(xs[0]) > calls.index(runs[0]) and (res / "done_x").exists()
    profiles = [c for c in calls if "live profile" in c]
    assert len(profiles) == 2 and "--workload sharegpt" in profiles[0] and str(head) in profiles[0]
    assert "data/gpu/live/hybrid_trace.jsonl" in profiles[1]
    assert not any("cli train" in c for c in calls)      # the head was there: no training
    assert (res / "qwen6" / "head.sha256").is_file() and (res / "done_s").exists()


def _staged_head_run(tmp_path, head_var: str):
    """(res, head, env) for running a live_job.sh case against a stand-in head (``head_var``: the case's head
    variable) and a fake interpreter that logs every call to ``tmp_path/calls``."""
    res, head = tmp_path / "res", tmp_path / "head"
    head.mkdir()
    for f, b in (("TRAINING.json", b"{}"), ("config.json", b"{}"), ("model.safetensors", b"w")):
        (head / f).write_bytes(b)
    fake = tmp_path / "py"
    fake.write_text("#!/bin/bash\necho \"$*\" >> " + str(tmp_path / "calls") + "\n")
    fake.chmod(0o755)
    return res, head, {"PY": str(fake), "PATH": "/usr/bin:/bin", "RES": str(res), "END": str(10 ** 10),
                       head_var: str(head)}


def _run_twice(case: str, env: dict, tmp_path):
    """live_job.sh CASE run twice (the second must repeat nothing): (every logged call, the parts run in order)."""
    for _ in range(2):
        r = subprocess.run(["bash", "gpu/live_job.sh", case], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=60)
        assert r.returncode == 0 and "PIPE_FINISHED" in r.stdout, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    return calls, [c.split()[3] for c in calls if c.startswith("-m spec_repro.engines.vllm.session run ")]


def test_the_eighth_sessions_plan_fits_and_run9_runs_u_v_the_profiles_then_z_once(tmp_path):
    """Session 5 (``gpu/live_job.sh start9``): the head staged from the cache (no training); parts u (code-edit)
    and v (sharegpt) each ONE EAGLE engine rotating EAGLE alone, gpu-pr24344, eagle-only and adaptive-rule (host
    policies padded, adaptive-rule priced with ADAPTIVE_COST) beside no SD, into one folder (qwen9) with distinct
    names; the device-side policy keeps its name (it always drafts k: no -pad); ``run9`` runs u, its no-SD
    profile, v, its profile (this run's outputs, --raw), then z, and a second run repeats nothing."""
    from spec_repro.engines.vllm import jobs as J

    pl = S.plan(session=5)
    assert pl["fits"] and pl["parts"] == ["u", "v", "z"] and pl["total_s"] < S.PLAN_LIMIT_S
    u, v, z = (S.part_specs(p, "H", "M") for p in "uvz")
    assert [x["name"] for x in u + v + z] == ["hybrid-default-rotate-s9", "hybrid-default-none-s9",
                                              "hybrid-default-rotate-sharegpt-s9", "hybrid-default-none-sharegpt-s9",
                                              "hybrid-default-ngram-s9"]
    for rot, wl in ((u[0], "code-edit"), (v[0], "sharegpt")):
        c = rot["config"]
        assert c["hybrid_rotate"] == list(S.ROTATE_POLICIES_9) and c["hybrid_pad"] and c["draft"] == "H"
        assert c["hybrid_cost_model"] == S.ADAPTIVE_COST and rot["tasks"][0]["workloads"] == [wl]
        assert rot["tasks"][0]["repeats"] == S.REPEATS_9 == 3
        assert [J.config_label(J.rotated_run_config(c, p)) for p in c["hybrid_rotate"]] == [
            "eagle", "gpu-pr24344", "eagle-only-pad", "adaptive-rule-pad"]
    with pytest.raises(ValueError, match="cost model"):
        J.rotated_spec("H", policies=("off", "adaptive-rule"), model_dir="M")
    res, head, env = _staged_head_run(tmp_path, "HEAD9")
    for p in "uvz":
        r = subprocess.run(["bash", "-c", f"source <(sed -n '/^pdir()/,/^detach()/p' gpu/live_job.sh | head -n -1); "
                            f"pdir {p}"], cwd=ROOT, capture_output=True, text=True, env=env)
        assert r.stdout.strip() == "qwen9", r.stderr
    calls, runs = _run_twice("run9", env, tmp_path)
    d = res / "qwen9"
    assert runs == ["u", "v", "z"] and all(f"--out {d} " in c and f"--head {head} " in c
                                           for c in calls if " session run " in c)
    prof = [c for c in calls if "live profile" in c]
    assert len(prof) == 2 and all(f"--raw {d} " in c and f"--head {head} " in c for c in prof)
    assert ["--workload code-edit" in prof[0], "--workload sharegpt" in prof[1]] == [True, True]
    at = {k: next(i for i, c in enumerate(calls) if f" run {k} " in c) for k in "uvz"}
    assert at["u"] < calls.index(prof[0]) < at["v"] < calls.index(prof[1]) < at["z"]
    assert sum("jobs lossless" in c for c in calls) == 3
    assert (d / "head.sha256").is_file() and (d / "head_config.json").is_file() and (d / "head_TRAINING.json").is_file()
    assert all((res / f"done_{p}").exists() for p in "uvz")


def test_the_ninth_sessions_plan_fits_and_run10_runs_y_its_profile_then_o_once(tmp_path):
    """Session 6 (``gpu/live_job.sh start10``): part y on sharegpt runs no SD FIRST (what the eighth session's
    deadline cut), then ONE EAGLE engine rotating five policies (the device-side machinery idle beside the
    host-side one: both hybrids get their own hybrid term); part o runs n-gram beside no SD on code-edit, then
    n-gram on sharegpt; ``run10`` profiles sharegpt's no-SD outputs between them, into qwen10, once."""
    from spec_repro.engines.vllm import jobs as J

    pl = S.plan(session=6)
    assert pl["fits"] and pl["parts"] == ["y", "o"] and pl["total_s"] < S.PLAN_LIMIT_S
    y, o = S.part_specs("y", "H", "M"), S.part_specs("o", "H", "M")
    assert [x["name"] for x in y + o] == ["hybrid-default-none-sharegpt-s10", "hybrid-default-rotate-sharegpt-s10",
                                          "hybrid-default-none-s10", "hybrid-default-ngram-s10",
                                          "hybrid-default-ngram-sharegpt-s10"]
    assert [x["tasks"][0]["workloads"] for x in y + o] == [["sharegpt"]] * 2 + [["code-edit"]] * 2 + [["sharegpt"]]
    assert all(x["tasks"][0]["repeats"] == S.REPEATS_9 for x in y + o)
    c = y[1]["config"]
    assert c["hybrid_rotate"] == list(S.ROTATE_POLICIES_10) and c["hybrid_pad"] and c["draft"] == "H"
    assert c["hybrid_cost_model"] == S.ADAPTIVE_COST
    assert [J.config_label(J.rotated_run_config(c, p)) for p in c["hybrid_rotate"]] == [
        "eagle", "gpu-pr24344", "gpu-eagle-only", "eagle-only-pad", "adaptive-rule-pad"]
    # priced by the eighth session's measured engines: the rotated one a fifth policy and a cold compile longer
    secs = {e["spec"]: e["seconds"] for st in pl["stages"] for e in st.get("engines", [])}
    assert secs["hybrid-default-rotate-sharegpt-s10"] == S.MEASURED_S["hybrid-default-rotate-sharegpt-s9"] + 92
    assert secs["hybrid-default-ngram-sharegpt-s10"] == S.MEASURED_S["hybrid-default-ngram-sharegpt-s5"]
    res, head, env = _staged_head_run(tmp_path, "HEAD10")
    calls, runs = _run_twice("run10", env, tmp_path)
    d = res / "qwen10"
    assert runs == ["y", "o"] and all(f"--out {d} " in c and f"--head {head} " in c
                                      for c in calls if " session run " in c)
    (prof,) = [c for c in calls if "live profile" in c]
    assert f"--raw {d} " in prof and "--workload sharegpt" in prof
    assert str(d / "hybrid_trace_sharegpt_s10.jsonl") in prof
    assert next(i for i, c in enumerate(calls) if " run y " in c) < calls.index(prof) < \
        next(i for i, c in enumerate(calls) if " run o " in c)
    assert sum("jobs lossless" in c for c in calls) == 2
    assert (d / "head.sha256").is_file() and all((res / f"done_{p}").exists() for p in "yo")


def test_the_eleventh_sessions_plan_fits_and_run11_runs_l_its_profile_q_its_profile_once(tmp_path):
    """Session 7 (``gpu/live_job.sh start11``): parts l (code-edit) and q (sharegpt), each no SD FIRST then ONE
    EAGLE engine rotating part y's five policies, priced by the tenth session's measured engines; ``run11`` profiles
    each part's no-SD outputs after it, into qwen11, and a second run repeats nothing."""
    pl = S.plan(session=7)
    assert pl["fits"] and pl["parts"] == ["l", "q"] and pl["total_s"] < S.PLAN_LIMIT_S
    lq = S.part_specs("l", "H", "M") + S.part_specs("q", "H", "M")
    assert [x["name"] for x in lq] == ["hybrid-default-none-s11", "hybrid-default-rotate-s11",
                                       "hybrid-default-none-sharegpt-s11", "hybrid-default-rotate-sharegpt-s11"]
    assert [x["tasks"][0]["workloads"] for x in lq] == [["code-edit"]] * 2 + [["sharegpt"]] * 2
    assert lq[1]["config"]["hybrid_rotate"] == list(S.ROTATE_POLICIES_10) == lq[3]["config"]["hybrid_rotate"]
    secs = {e["spec"]: e["seconds"] for st in pl["stages"] for e in st.get("engines", [])}
    assert secs["hybrid-default-rotate-s11"] == S.MEASURED_S["hybrid-default-rotate-sharegpt-s10"]
    res, head, env = _staged_head_run(tmp_path, "HEAD11")
    calls, runs = _run_twice("run11", env, tmp_path)
    d = res / "qwen11"
    assert runs == ["l", "q"] and all(f"--out {d} " in c and f"--head {head} " in c
                                      for c in calls if " session run " in c)
    profs = [c for c in calls if "live profile" in c]
    assert len(profs) == 2
    assert "--workload code-edit" in profs[0] and str(d / "hybrid_trace_s11.jsonl") in profs[0]
    assert "--workload sharegpt" in profs[1] and str(d / "hybrid_trace_sharegpt_s11.jsonl") in profs[1]
    at = lambda key: next(i for i, c in enumerate(calls) if key in c)
    assert at(" run l ") < calls.index(profs[0]) < at(" run q ") < calls.index(profs[1])
    assert sum("jobs lossless" in c for c in calls) == 2 and all((res / f"done_{p}").exists() for p in "lq")


def test_device_trace_reads_the_latest_sessions_profile_of_the_workload(tmp_path):
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


def test_the_twelfth_sessions_plan_trains_a_head_then_q_first_and_run12_trains_once(tmp_path):
    """Session 8 (``gpu/live_job.sh start12``): a new checkout keeps no head, so ``run12`` trains one into
    qwen11/head (once: a second run finds it), runs part q (sharegpt, live9's miss) with it, profiles q's no-SD
    outputs, then part l and its profile in the time left; the plan prices the training and defers l."""
    pl = S.plan(session=8)
    assert pl["fits"] and pl["parts"] == ["q"] and pl["dropped"] == ["l"] and pl["total_s"] < S.PLAN_LIMIT_S
    assert any("train a head" in st["stage"] and st["seconds"] >= 530 for st in pl["stages"])
    res = tmp_path / "res"
    fake = tmp_path / "py"     # logs every call; `cli train` writes a head where --out says, as training does
    fake.write_text("#!/bin/bash\necho \"$*\" >> " + str(tmp_path / "calls") + "\n"
                    "if [[ \"$*\" == *\"cli train eagle\"* ]]; then a=($*); for i in ${!a[@]}; do\n"
                    "  [ \"${a[$i]}\" = --out ] && { o=${a[$((i+1))]}; mkdir -p $o; echo '{}' > $o/TRAINING.json;\n"
                    "  echo '{}' > $o/config.json; echo w > $o/model.safetensors; }; done; fi\n")
    fake.chmod(0o755)
    env = {"PY": str(fake), "PATH": "/usr/bin:/bin", "RES": str(res), "END": str(10 ** 10)}
    calls, runs = _run_twice("run12", env, tmp_path)
    d, head = res / "qwen11", res / "qwen11" / "head"
    assert sum("cli train eagle" in c for c in calls) == 1 and f"--out {head} " in calls[0]
    assert runs == ["q", "l"] and all(f"--out {d} " in c and f"--head {head} " in c
                                      for c in calls if " session run " in c)
    profs = [c for c in calls if "live profile" in c]
    assert len(profs) == 2 and all(f"--head {head} " in c for c in profs)
    assert "--workload sharegpt" in profs[0] and str(d / "hybrid_trace_sharegpt_s11.jsonl") in profs[0]
    assert "--workload code-edit" in profs[1] and str(d / "hybrid_trace_s11.jsonl") in profs[1]
    at = lambda key: next(i for i, c in enumerate(calls) if key in c)
    assert at(" run q ") < calls.index(profs[0]) < at(" run l ") < calls.index(profs[1])
    for f in ("head.sha256", "head_TRAINING.json", "head_config.json", "host.txt"):
        assert (d / f).is_file(), f
    assert all((res / f"done_{p}").exists() for p in "tql")


def test_the_ninth_plan_fits_a_1500_s_lease_by_cutting_the_heads_training():
    """Session 9: session 8's run (``start12``) on a lease of 1,500 device seconds: the plan fits under the lease
    less a 50 s reserve only with the training cut to ``TRAIN_BUDGET_9`` (session 8's stages do not), part q kept
    and l deferred."""
    limit = S.LEASE_9 - 50
    assert not S.plan(limit, session=8)["parts"]           # session 8's plan at this lease: nothing fits
    pl = S.plan(limit, session=9)
    assert pl["fits"] and pl["parts"] == ["q"] and pl["dropped"] == ["l"] and pl["total_s"] <= limit
    assert any(f"{S.TRAIN_BUDGET_9} s budget" in st["stage"] for st in pl["stages"])
