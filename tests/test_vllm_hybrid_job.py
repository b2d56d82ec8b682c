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
    # another batch size has no baseline: no row (a run whose baseline never ran is not a difference)
    assert J.lossless_report([run("none", outs), run("pr24344", outs, b=32)]) == []
    # only the requests the baseline ran are counted
    part = {**run("none", outs[:5]), "keys": keys[:5]}
    rep = J.lossless_report([part, run("pr24344", bad)])
    assert [(r["equal"], r["total"]) for r in rep] == [(4, 5)]


def test_padded_methods_true_default_and_uninstrumented_specs(tmp_path):
    """-pad methods carry the pad option (ngram-pad: n-gram alone through the hybrid, padded); vllm-default is
    vLLM's own choice of runner (no VLLM_USE_V2_MODEL_RUNNER=0) and untimed; instrumented=False names -noinst."""
    specs = J.hybrid_specs("/h", model_dir="/m", methods=("none",) + J.PADDED_METHODS + ("pr24344",))
    by = {s["name"]: s for s in specs}
    assert list(by) == ["hybrid-default-none", "hybrid-default-pr24344-pad", "hybrid-default-pr24344-skip-pad",
                        "hybrid-default-ngram-pad", "hybrid-default-pr24344"]
    want = {"pr24344-pad": "pr24344", "pr24344-skip-pad": "pr24344-skip", "ngram-pad": "ngram-only"}
    for m, pol in want.items():
        s = by[f"hybrid-default-{m}"]
        assert s["config"]["hybrid"] == pol and s["config"]["hybrid_pad"] is True and s["config"]["method"] == "eagle"
        env = engine_env(VLLMConfig(**s["config"], step_log=str(tmp_path / "s.jsonl")))
        assert env["SPEC_REPRO_HYBRID"] == pol and env["SPEC_REPRO_HYBRID_PAD"] == "1"
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and s.get("instrumented", True)
    assert "hybrid_pad" not in by["hybrid-default-pr24344"]["config"]
    assert "SPEC_REPRO_HYBRID_PAD" not in engine_env(VLLMConfig(**by["hybrid-default-pr24344"]["config"]))
    rows = J.hybrid_plan(specs)
    assert [r["pad"] for r in rows] == [False, True, True, True, False]
    # vLLM's true default: its own runner choice, no step log
    vd = J.hybrid_specs("/h", model_dir="/m", methods=("eagle", "none"), engine_config="vllm-default")
    assert [s["name"] for s in vd] == ["hybrid-vllm-default-eagle", "hybrid-vllm-default-none"]
    for s in vd:
        assert s["instrumented"] is False and s["config"]["model_runner"] == "default"
        assert s["config"]["async_scheduling"] is None
        assert "VLLM_USE_V2_MODEL_RUNNER" not in engine_env(VLLMConfig(**s["config"]))
    noinst, = J.hybrid_specs("/h", model_dir="/m", methods=("none",), instrumented=False)
    assert noinst["name"] == "hybrid-default-none-noinst" and noinst["instrumented"] is False
    assert noinst["config"] == by["hybrid-default-none"]["config"]       # the same engine, only untimed
    for kw, msg in [(dict(methods=("pr24344",), engine_config="vllm-default"), "wraps the V1 runner"),
                    (dict(methods=("eagle-pad",)), "can be padded"),
                    (dict(methods=("adaptive-rule-pad",)), "cost model")]:
        with pytest.raises(ValueError, match=msg):
            J.hybrid_specs("/h", model_dir="/m", **kw)


def test_uninstrumented_spec_runs_without_a_step_log(tmp_path, monkeypatch):
    """run_spec builds the engine without step_log for an instrumented=False spec (the plugin then never
    registers: vLLM unchanged) and with one otherwise."""
    from spec_repro.engines.vllm import engine as E

    seen = []

    class Fake:
        def __init__(self, cfg):
            seen.append(cfg)
            self.cfg, self.start_s, self.instrumented, self.vllm_version = cfg, 1.0, bool(cfg.step_log), "0.25.0"

        def steps(self, op, **kw):
            return None if not self.cfg.step_log else [{"patched": True}]

        def close(self):
            pass

    monkeypatch.setattr(E, "VLLMEngine", Fake)
    for inst in (False, True):
        spec, = J.hybrid_specs("/h", model_dir="/m", methods=("none",), instrumented=inst)
        J.run_spec({**spec, "tasks": []}, tmp_path)
    assert seen[0].step_log is None and seen[1].step_log.endswith("steps_hybrid-default-none.jsonl")
    recs = [json.loads(x) for x in open(tmp_path / "results.jsonl")]
    eng = [r for r in recs if r["kind"] == "engine"]
    assert [r["spec"] for r in eng] == ["hybrid-default-none-noinst", "hybrid-default-none"]
    assert [r["instrumented"] for r in eng] == [False, True]
    assert [r["kind"] for r in recs].count("done") == 2


def test_lossless_report_names_padded_configurations():
    recs = [{"kind": "run", "task": "hybrid", "spec": s, "config": c, "workload": "w", "batch_size": 1,
             "keys": ["x"], "outputs": [o]}
            for s, c, o in [("n", {"method": "none"}, [1, 2]), ("p", {"method": "eagle", "hybrid": "pr24344"}, [1, 2]),
                            ("pp", {"method": "eagle", "hybrid": "pr24344", "hybrid_pad": True}, [1, 3])]]
    rep = J.lossless_report(recs)
    assert [(r["config"], r["equal"]) for r in rep] == [("pr24344", 1), ("pr24344-pad", 0)]
    assert rep[1]["first_difference"] == {"key": "x", "position": 1}
