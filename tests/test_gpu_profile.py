"""`spec-repro reproduce --profile gpu`: its grid (pure), what it refuses without a GPU, and the notebooks reading what
such a run leaves (here: the committed live tables and vLLM results, recorded on the H200)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from spec_repro.engines.vllm import gpu_profile as G
from spec_repro.engines.vllm.hybrid_jobs import config_label, eagle_alone, rotated_run_config, split_k
from spec_repro.locations import v1_runner_dir

ROOT = Path(__file__).resolve().parents[1]


def test_grid_is_the_v2_hybrid_job_gated_by_its_lossless_check_then_llama_on_the_default_engine():
    g = G.grid_specs("/h", "/m")
    assert list(g) == ["lossless", "grid", "llama"]
    assert [s["name"] for s in g["grid"]] == ["v2hybrid-grid-none", "v2hybrid-grid-rotate", "v2hybrid-grid-rotate-k3",
                                              "v2hybrid-grid-ngram"]
    # every Qwen engine runs the V2 runner (forced, as vLLM picks it for EAGLE) but vLLM's n-gram (V1 only)
    for st in G.V2_STAGES:
        for s in g[st]:
            want = ("v1", "v1-forced") if s["name"].endswith("-ngram") else ("v2", "v2-forced")
            assert (s["config"]["model_runner"], s["engine_config"]) == want, s["name"]
    rot = g["grid"][1]["config"]
    assert rot["hybrid_rotate"] == ["off", "gpu-eagle-only", "gpu-pr24344", "gpu-pr24344-skip"] and rot["k"] == 5
    # EAGLE alone at its best fixed k and the hybrid at that k, rotated in an engine of their own, named in tables
    best = g["grid"][2]
    assert (best["config"]["method"], best["config"]["k"]) == ("eagle", 3)
    assert best["config"]["hybrid_rotate"] == ["off", "gpu-pr24344-skip"]
    assert [config_label(rotated_run_config(best["config"], p)) for p in best["config"]["hybrid_rotate"]] == \
        ["eagle-k3", "gpu-pr24344-skip-k3"]
    assert [config_label(rotated_run_config(rot, p)) for p in rot["hybrid_rotate"]] == list(
        ("eagle", "gpu-eagle-only", "gpu-pr24344", "gpu-pr24344-skip"))
    assert [t["type"] for t in best["tasks"]] == ["hybrid"] and best["tasks"][0]["repeats"] == 4
    assert {k: v for k, v in best["tasks"][0].items() if k != "repeats"} == \
        {k: v for k, v in g["grid"][0]["tasks"][-1].items() if k != "repeats"}     # no SD's shapes and tokens
    from spec_repro.engines.vllm.engine import VLLMConfig, speculative_config

    assert speculative_config(VLLMConfig(**best["config"]))["num_speculative_tokens"] == 3
    assert [split_k(c) for c in ("eagle-k3", "gpu-pr24344-skip-k3", "eagle", "gpu-pr24344-skip-pad")] == \
        [("eagle", 3), ("gpu-pr24344-skip", 3), ("eagle", None), ("gpu-pr24344-skip-pad", None)]
    from spec_repro import analysis as A

    assert A.live_ks(pd.DataFrame({"method": ["eagle", "eagle-k3", "gpu-pr24344-skip-k3", "ngram"]})) == [3]
    assert [eagle_alone(c) for c in ("gpu-pr24344-skip-k3", "gpu-pr24344", "eagle-k3")] == ["eagle-k3", "eagle", "eagle-k3"]
    assert G.STAGES.index("lossless") < G.STAGES.index("grid") < G.STAGES.index("profile") < G.STAGES.index("tables")
    # the Llama-dims baseline and n-gram side by side, vLLM's default engine (its runner, async where allowed)
    assert [s["name"] for s in g["llama"]] == ["llama8b-none-default-s2", "llama8b-ngram-default-s2"]
    a, b = (s["config"] for s in g["llama"])
    assert {k: v for k, v in a.items() if k not in ("method", "k")} == \
        {k: v for k, v in b.items() if k not in ("method", "k")}
    assert (a["method"], b["method"], b["k"]) == ("none", "ngram", 3) and a["model_runner"] == "default"
    assert g["llama"][0]["tasks"][0]["batch_sizes"] == [1, 16, 64, 256]


def test_the_lossless_stage_counts_as_finished_only_once_its_gate_passed(tmp_path):
    names = [s["name"] for s in G.grid_specs("/h", "/m")["lossless"]]
    d = tmp_path / "raw" / G.V2_DIR / "lossless"
    d.mkdir(parents=True)
    (d / "results.jsonl").write_text("".join(json.dumps({"kind": "done", "spec": n}) + "\n" for n in names))
    assert not G.status(tmp_path)["lossless"]                     # engines done, gate not checked
    (d / "lossless.jsonl").write_text(json.dumps({"lossless": False, "runs": 8}) + "\n")
    assert not G.status(tmp_path)["lossless"]
    (d / "lossless.jsonl").write_text(json.dumps({"lossless": True, "runs": 8}) + "\n")
    assert G.status(tmp_path)["lossless"] and not G.status(tmp_path)["grid"]


def test_status_and_parameters_of_an_empty_folder(tmp_path):
    assert G.status(tmp_path) == dict.fromkeys(G.STAGES, False)
    assert G.notebook_parameters(tmp_path) == {"backend": "embedded"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_one_clear_line_and_no_files_left(tmp_path):
    from spec_repro.reproduce import reproduce

    with pytest.raises(SystemExit, match="--profile gpu runs vLLM"):
        reproduce("gpu", tmp_path / "out", progress=False)
    assert not list((tmp_path / "out" / "notebooks").glob("*.source.ipynb"))


def test_parameters_name_what_each_stage_left(tmp_path):
    from spec_repro.collect import trace_path

    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "runs.csv").write_text("spec\n")
    res = tmp_path / "raw" / G.LLAMA_DIR / "results.jsonl"
    res.parent.mkdir(parents=True)
    res.write_text(json.dumps({"kind": "engine", "spec": "x"}) + "\n")
    assert "vllm_results" not in G.notebook_parameters(tmp_path)           # no engine finished: not read
    res.write_text(res.read_text() + json.dumps({"kind": "done", "spec": "x"}) + "\n")
    # the Llama runs without the traces: the notebooks may not collect traces live in the kernel
    assert G.notebook_parameters(tmp_path)["backend"] == "embedded"
    t = trace_path(tmp_path / "traces", "qwen2.5-coder-1.5b", "code-edit")
    t.parent.mkdir(parents=True)
    t.write_bytes(b"")
    p = G.notebook_parameters(tmp_path)
    assert p == {"backend": "vllm", "live_dir": str(tmp_path / "live"), "vllm_results": str(res),
                 "traces": [str(t)], "cost_model": G.LIVE_COST_MODEL}


def test_every_parameter_the_gpu_profile_passes_is_declared():
    """reproduce refuses an undeclared parameter: the GPU profile's must all be declared by some notebook."""
    import papermill as pm

    from spec_repro.reproduce import NOTEBOOKS, source_notebook

    import nbformat, tempfile
    declared = set()
    with tempfile.TemporaryDirectory() as d:
        for n in NOTEBOOKS:
            p = Path(d) / f"{n}.ipynb"
            nbformat.write(source_notebook(n), str(p))
            declared |= set(pm.inspect_notebook(str(p)))
    assert {"backend", "live_dir", "vllm_results", "traces", "cost_model"} <= declared


def test_notebook_02_reads_a_gpu_runs_live_tables(tmp_path):
    """The GPU profile's notebook 02 on a live folder: the committed one (recorded on the H200, 2026-12-01)."""
    from spec_repro.reproduce import reproduce

    res, table = reproduce("embedded", tmp_path, notebooks=["02_verification_bottleneck"], progress=False,
                           parameters={"backend": "vllm", "live_dir": str(v1_runner_dir("agreement")),
                                       "vllm_results": str(ROOT / "data" / "gpu" / "results.jsonl")})
    assert res[0].ok, res[0].error
    assert "02_time_breakdown_live.png" in res[0].figures
    live = table[table["source"].str.contains("real weights")]
    assert len(live) and live["quantity"].str.contains("qwen2.5-coder-1.5b").all()


def test_a_timed_out_spec_takes_its_engine_process_with_it(tmp_path):
    """vLLM's engine core is a child of the spec's process: a timeout must end both (else it keeps the GPU)."""
    import os
    import sys
    import time

    from spec_repro.engines.vllm.jobs import run_group

    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f" open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    t0 = time.time()
    assert run_group([sys.executable, "-c", code], 3) == "timeout"
    assert time.time() - t0 < 40
    child = int(pid_file.read_text())
    time.sleep(0.5)
    try:
        state = Path(f"/proc/{child}/stat").read_text().split()[2]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X"), f"the engine-like child {child} is still running ({state})"
    assert run_group([sys.executable, "-c", "raise SystemExit(3)"], 10) == 3


def test_padded_walk_is_uniform_and_pays_k_plus_one_tokens_per_request():
    """The live predictor's padded configurations (every draft padded to k): no ragged step, each step verifies
    1 + k tokens per request, and with the same acceptance they take as many steps as the unpadded rule."""
    from spec_repro.engines.vllm import live

    reqs = [{"prompt_len": 10, "draft_len": {"ngram": [2, 0] * 150}, "acc": {"ngram": [3, 1] * 150,
                                                                            "eagle": [2, 4] * 150}}] * 2
    F = [0.0, 1e-4, 1e-3]
    model = {"prefill": [0.0, 0.0], "F_uniform": F, "F_ragged": [0.0, 1e-4, 5e-3], "eagle_draft": [0.0, 1e-4],
             "ngram_draft": [0.0], "overhead_eagle": [0.0, 0.0], "hybrid_overhead": [2e-3, 0.0],
             "wall_over_steps": {"eagle": 1.0}}
    pad, raw = (live._walk(reqs, c, model, max_tokens=60, k=5) for c in ("pr24344-pad", "pr24344"))
    assert pad["ragged_steps"] == 0 < raw["ragged_steps"]
    assert pad["steps"] == raw["steps"]
    per_step = 1e-4 * 2 * 6 + 1e-3 + 5 * 1e-4 + 2e-3        # verify 2 x (1 + 5), F0, EAGLE's 5 tokens, the hybrid
    assert abs(pad["seconds"] - pad["steps"] * per_step) < 1e-9


def test_the_idle_policy_is_a_pass_through_counted_as_eagle():
    from spec_repro.engines.vllm import hybrid as H
    from spec_repro.engines.vllm.jobs import config_label, hybrid_method

    assert H.PASSTHROUGH == ("idle",) and "eagle-only" not in H.PASSTHROUGH   # eagle-only keeps the machinery
    assert hybrid_method("idle") == ("eagle", "idle", False)
    assert config_label({"method": "eagle", "hybrid": "idle"}) == "idle"
    s = H.passthrough_summary(3, 5, ["a", "b", "c"])
    assert (s["eagle"], s["eagle_tokens"], s["ngram"], s["none"], s["passthrough"]) == (3, 15, 0, 0, True)
    assert s["per_req"] == {"a": ["eagle", 5], "b": ["eagle", 5], "c": ["eagle", 5]}
    assert set(s) - {"passthrough", "per_req"} == {"ngram", "eagle", "none", "ngram_tokens", "eagle_tokens",
                                                  "eagle_needed"}      # LiveHybrid.summary's keys, padding off
    # were the pure logic ever asked, it chooses as eagle-only does
    import numpy as np
    pol = H.HybridPolicy("idle", 3)
    st = pol.new_state(4)
    c = pol.select(st, np.array([1, 2, 3, 1, 2, 3], np.int64), [1, 2], [7, 8, 9], 1)
    assert (c.source, c.draft) == ("eagle", [7, 8, 9])


def test_runs_outside_data_gpu_name_their_own_machine_and_date(tmp_path):
    """A GPU profile's results (or a user's) carry their own provenance, not the committed manifest's."""
    from spec_repro import measured as M

    res = tmp_path / "results.jsonl"
    with open(res, "w") as f:
        for line in open(ROOT / "data" / "gpu" / "results.jsonl"):
            d = json.loads(line)
            if d.get("spec") in ("llama8b-none-s3", "llama8b-ngram-s3"):
                if d.get("kind") == "engine":
                    d["env"] = {**d.get("env", {}), "gpu": "Some Other GPU", "torch": "9.9"}
                f.write(json.dumps(d) + "\n")
    table, src = M.gpu_speedups(res)
    assert table is not None and len(table)
    assert "Some Other GPU" in src and "torch 9.9" in src and "per engine" not in src
    assert "per engine" in M.gpu_speedups()[1]          # the committed runs keep their manifest's line


def test_deadline_zero_runs_the_notebooks_on_a_copied_gpu_folder_without_a_gpu(tmp_path):
    """A GPU profile's folder copied to a CPU machine (here: the committed H200 run's live tables and traces):
    --gpu-deadline 0 starts nothing, needs no GPU, keeps the copied tables, and the notebooks read them."""
    import shutil

    from spec_repro.reproduce import reproduce

    src = v1_runner_dir("reproduce-grid")
    gpu = tmp_path / "out" / "gpu"
    shutil.copytree(src / "live", gpu / "live")
    shutil.copytree(src / "traces", gpu / "traces")
    before = (gpu / "live" / "runs.csv").read_bytes()
    res, table = reproduce("gpu", tmp_path / "out", notebooks=["01_proposers_vs_batch"], gpu_deadline_s=0,
                           progress=False, parameters={"batch_sizes": [1, 8], "also_h200_fit": False})
    assert res[0].ok, res[0].error
    assert (gpu / "live" / "runs.csv").read_bytes() == before and not (gpu / "raw").exists()
    log = json.loads((gpu / "gpu_profile.json").read_text().splitlines()[-1])
    assert log["stages"]["grid"] == "not started (deadline 0)"
    src_col = " ".join(table["source"])
    assert "pr24344-skip-pad" in " ".join(table["quantity"]) or "pr24344-skip-pad" in " ".join(table["this_run"])
    assert "2026-12-01T23:21:58" in src_col          # the H200 run's own date, from its copied tables


def _stage_runner(monkeypatch, tmp_path):
    """gpu_profile.run with the engines replaced by a recorder of what would start (no vLLM here): each engine spec
    'finishes' at once, the lossless engines' outputs all equal (the gate's own logic: tests/test_vllm_v2.py)."""
    from spec_repro import collect, models
    from spec_repro.engines.vllm import jobs, live_profile

    started = []

    def run_specs(specs, sub, timeout, deadline_s=None):
        started.append(sub.name)
        sub.mkdir(parents=True, exist_ok=True)
        with open(sub / "results.jsonl", "a") as f:
            for s in specs:
                for c in (("none",) if s["name"].endswith("-none") else ("eagle", "gpu-pr24344")) \
                        if sub.name == "lossless" else ():
                    cfg = {"method": "none" if c == "none" else "eagle", **({"hybrid": c} if c != "eagle" else {})}
                    f.write(json.dumps({"kind": "run", "spec": s["name"], "task": "hybrid", "config": cfg,
                                        "workload": "code-edit", "batch_size": 1, "repeat": 0, "keys": ["a"],
                                        "outputs": [[1, 2]]}) + "\n")
                f.write(json.dumps({"kind": "done", "spec": s["name"]}) + "\n")
        return 0

    monkeypatch.setattr(jobs, "run_specs", run_specs)
    monkeypatch.setattr(G, "_need_gpu", lambda: None)
    monkeypatch.setattr(models, "convert", lambda m: "/m")
    monkeypatch.setattr(live_profile, "profile_hybrid_task", lambda *a, **k: started.append("profile"))
    monkeypatch.setattr(collect, "collect", lambda *a, **k: started.append("traces"))
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(b"")
    return started, head


def test_a_failed_lossless_gate_stops_every_gpu_stage_after_it(monkeypatch, tmp_path):
    started, head = _stage_runner(monkeypatch, tmp_path)
    st = G.run(tmp_path / "ok", head=head, deadline_s=10_000, reserve_s=0, progress=lambda *_: None)
    assert started == ["lossless", "grid", "profile", "profile", "traces", "llama8b2"]
    assert st["lossless"] and st["grid"]
    started.clear()
    from spec_repro.engines.vllm import v2hybrid

    monkeypatch.setattr(v2hybrid, "check_lossless", lambda recs: (False, []))
    st = G.run(tmp_path / "bad", head=head, deadline_s=10_000, reserve_s=0, progress=lambda *_: None)
    assert started == ["lossless"] and not st["lossless"] and not st["grid"]
    log = json.loads((tmp_path / "bad" / "gpu_profile.json").read_text().splitlines()[-1])
    assert log["stages"]["grid"].startswith("not started: the lossless gate failed")
    assert json.loads((tmp_path / "bad" / "raw" / G.V2_DIR / "lossless" / "lossless.jsonl").read_text()) == \
        {"lossless": False, "runs": 0}


def test_a_deadline_skips_the_stages_it_leaves_no_time_for(monkeypatch, tmp_path):
    started, head = _stage_runner(monkeypatch, tmp_path)
    G.run(tmp_path / "o", head=head, deadline_s=G.PROFILE_S - 1, reserve_s=0, progress=lambda *_: None)
    assert started == ["lossless", "grid", "llama8b2"]         # engine specs get run_specs' own deadline check
    log = json.loads((tmp_path / "o" / "gpu_profile.json").read_text().splitlines()[-1])
    assert log["stages"]["profile"].startswith("not started") and log["stages"]["traces"].startswith("not started")


def test_deadline_zero_summarizes_a_returned_raw_folder(tmp_path):
    """The H100 run's raw records (data/gpu/raw/v2hybrid-h100, unzipped) as the device returns them: --gpu-deadline
    0 starts no GPU stage but writes the tables (CPU), which the notebooks then read (live_dir); without traces or
    Llama runs the notebooks get backend "embedded" (committed data for what the run lacks)."""
    import gzip

    from spec_repro.paths import data_dir

    src = data_dir() / "gpu" / "raw" / "v2hybrid-h100"
    for f in src.glob("*/*.jsonl.gz"):
        dst = tmp_path / "raw" / G.V2_DIR / f.parent.name / f.name[:-3]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(gzip.open(f).read())
    st = G.run(tmp_path, head=tmp_path / "no-head", deadline_s=0, progress=lambda *_: None)
    assert st["tables"] and not st["grid"] and not st["profile"]
    log = json.loads((tmp_path / "gpu_profile.json").read_text().splitlines()[-1])
    assert log["stages"]["grid"] == "not started (deadline 0)" and "seconds" in log["stages"]["tables"]
    assert {"runs.csv", "ratios.csv", "overhead.csv", "lossless.csv"} <= {p.name for p in (tmp_path / "live").iterdir()}
    assert G.notebook_parameters(tmp_path) == {"backend": "embedded", "live_dir": str(tmp_path / "live")}
