"""The live hybrid's device job (jobs.hybrid_specs / hybrid_plan / lossless_report) on CPU: the plan is printed
without vLLM, each configuration is one engine running every workload, batch size and repeat, and the lossless
check finds a difference in real output ids (the committed Qwen trace's)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_repro.engines.vllm import jobs as J
from spec_repro.engines.vllm.engine import VLLMConfig, engine_env, engine_kwargs
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]


def test_plan_is_one_engine_per_configuration_and_runs_without_vllm(tmp_path):
    specs = J.hybrid_specs("/heads/qwen-eagle", model_dir="/m/qwen", cost_model="h200-qwen.json")
    assert [s["name"] for s in specs] == [f"hybrid-default-{m}" for m in J.HYBRID_METHODS]
    for s in specs:
        cfg = VLLMConfig(**s["config"], step_log=str(tmp_path / "s.jsonl"))
        engine_kwargs(cfg)                 # every configuration is a valid engine
        env = engine_env(cfg)
        assert env.get("SPEC_REPRO_HYBRID") == s["config"].get("hybrid")
        t, = s["tasks"]
        assert t["workloads"] == ["code-edit", "sharegpt"] and t["batch_sizes"] == [1, 8, 32, 64]
        assert cfg.max_num_seqs == 64 and cfg.async_scheduling is None    # the default engine
    by = {s["name"].split("-", 2)[2]: s["config"] for s in specs}
    assert by["none"]["method"] == "none" and "draft" not in by["ngram"]
    assert by["adaptive-rule"]["hybrid_cost_model"] == "h200-qwen.json" and by["pr24344"]["draft"] == "/heads/qwen-eagle"
    rows = J.hybrid_plan(specs, done={"hybrid-default-none"})
    assert [r["runs"] for r in rows] == [2 * 4 * 3] * 6 and rows[0]["done"] and not rows[1]["done"]
    assert all(70 < r["seconds"] < 600 for r in rows)
    with pytest.raises(ValueError, match="cost model"):
        J.hybrid_specs("/h", model_dir="/m")
    sl = J.hybrid_specs("/h", model_dir="/m", methods=("none", "eagle"), engine_config="study-like")
    assert [s["config"]["async_scheduling"] for s in sl] == [False, False]
    # the command line's plan: no vLLM, no torch imported; finished specs are marked done
    (tmp_path / "results.jsonl").write_text(json.dumps({"kind": "done", "spec": "hybrid-default-ngram"}) + "\n")
    code = ("import sys, runpy; sys.argv = ['jobs', 'hybrid', '--head', '/h', '--model-dir', '/m', '--out', "
            f"{str(tmp_path)!r}, '--plan']; "
            "from spec_repro.engines.vllm import jobs; rc = jobs.main(sys.argv[1:]); "
            "assert rc == 0 and not {'vllm', 'torch'} & set(sys.modules), sorted({'vllm', 'torch'} & set(sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["spec"] for x in lines[:-1]] == [f"hybrid-default-{m}" for m in J.HYBRID_METHODS if m != "adaptive-rule"]
    assert [x["done"] for x in lines[:-1]] == [False, True, False, False, False]
    assert lines[-1]["runs"] == 5 * 24 and lines[-1]["seconds_left"] == sum(x["seconds"] for x in lines[:-1]
                                                                           if not x["done"])


def test_lossless_report_on_real_outputs():
    t = read_trace(ROOT / "data" / "traces" / "qwen2.5-coder-1.5b__code-edit.parquet")
    req = t.requests.drop_duplicates("request_id").head(8)
    keys = req["request_id"].astype(str).tolist()
    outs = [list(map(int, o))[:256] for o in req["output_token_ids"]]

    def run(conf, outputs, b=8):
        cfg = {"method": "eagle" if conf.startswith("pr") else conf, **({"hybrid": conf} if conf.startswith("pr") else {})}
        return {"kind": "run", "task": "hybrid", "spec": f"hybrid-default-{conf}", "config": cfg, "workload": "code-edit",
                "batch_size": b, "repeat": 0, "chunk": 0, "keys": keys, "outputs": outputs}

    bad = [list(o) for o in outs]
    bad[3][17] += 1
    recs = [run("none", outs), run("eagle", outs), run("pr24344", bad), {"kind": "done", "spec": "x"}]
    rep = J.lossless_report(recs)
    assert [(r["config"], r["equal"], r["total"]) for r in rep] == [("eagle", 8, 8), ("pr24344", 7, 8)]
    assert rep[0]["first_difference"] is None and rep[1]["first_difference"] == {"key": keys[3], "position": 17}
    # another batch size has no baseline: nothing is equal, the difference has no position
    rep = J.lossless_report([run("none", outs), run("pr24344", outs, b=32)])
    assert rep[0]["equal"] == 0 and rep[0]["first_difference"] == {"key": keys[0], "position": None}
