"""The V2 grid job (v2grid): its engine specs, its plan against the lease, and runs parsed into rows. The metrics
below are built from vLLM 0.25's documented metric names (``LLM.get_metrics()``); they are not a recorded run."""
from types import SimpleNamespace

import pytest

from spec_repro.engines.vllm import engine as V
from spec_repro.engines.vllm import v2grid as G


def specs(**kw):
    return G.grid_specs("/h", model_dir="/m", draft_dir="/d", **kw)


def test_specs_are_vllms_own_choice_in_priority_order():
    s = specs()
    assert [x["name"] for x in s] == ["v2grid-none-k0", "v2grid-eagle-k3", "v2grid-ngram-k5", "v2grid-eagle-k1",
                                      "v2grid-eagle-k5", "v2grid-eagle-k2", "v2grid-draft_model-k3"]
    for x in s:
        c = x["config"]
        assert x["engine_config"] == "default" and x["instrumented"] is False and "step_log" not in c
        assert c["model_runner"] == "default" and c["async_scheduling"] is None and "hybrid" not in c
        assert c["model"] == "/m" and c["max_num_seqs"] == 64
        cfg = V.VLLMConfig(**c)                       # a valid engine configuration, vLLM's runner left to vLLM
        assert "VLLM_USE_V2_MODEL_RUNNER" not in V.engine_env(cfg) and "async_scheduling" not in V.engine_kwargs(cfg)
        (t,) = x["tasks"]
        assert t["type"] == "hybrid" and t["workloads"] == ["code-edit", "sharegpt"]      # code-edit first
        assert t["batch_sizes"] == [1, 8, 32, 64] and t["repeats"] >= 3                 # bs 1 first
    by = {x["name"]: x["config"] for x in s}
    assert by["v2grid-eagle-k3"]["draft"] == "/h" and by["v2grid-draft_model-k3"]["draft"] == "/d"
    sc = V.speculative_config(V.VLLMConfig(**by["v2grid-ngram-k5"]))
    assert (sc["prompt_lookup_min"], sc["prompt_lookup_max"]) == (3, 7)      # as the study
    assert [x["name"] for x in specs(draft_k=None)][-1] == "v2grid-eagle-k2"
    with pytest.raises(ValueError, match="repeats"):
        specs(repeats=2)


def test_plan_fits_the_lease_or_names_what_it_defers():
    plan = G.load_plan()
    p = G.plan_rows(specs(), plan)
    assert p["limit_s"] == 1500
    assert p["fits"], p
    names = [x["name"] for x in specs()]
    assert set(p["deferred"]) <= set(names)
    ran = [r for r in p["rows"] if r["stage"].startswith("engine ") and not r["deferred"]]
    assert [r["stage"] for r in ran][:2] == ["engine v2grid-none-k0", "engine v2grid-eagle-k3"]   # first priorities
    assert p["total_s"] + p["deferred_s"] > p["limit_s"] or not p["deferred"]   # deferring was needed, or none is


def _metric(name, value=None, values=None):
    # the shape of vllm.v1.metrics.reader's Counter / Vector (name, labels, value / values)
    return SimpleNamespace(name=name, labels={"model_name": "m", "engine": "0"}, value=value, values=values)


def test_spec_decode_metrics_parse_into_a_row():
    before = [_metric("vllm:spec_decode_num_drafts", 10), _metric("vllm:spec_decode_num_draft_tokens", 30),
              _metric("vllm:spec_decode_num_accepted_tokens", 20), _metric("vllm:generation_tokens", 100),
              _metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[9, 7, 4])]
    after = [_metric("vllm:spec_decode_num_drafts", 110), _metric("vllm:spec_decode_num_draft_tokens", 330),
             _metric("vllm:spec_decode_num_accepted_tokens", 170), _metric("vllm:generation_tokens", 356),
             _metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[79, 57, 34]),
             _metric("vllm:num_requests_running", 0)]
    d = V.diff_spec_metrics(V.parse_spec_metrics(after), V.parse_spec_metrics(before))
    assert d == {"num_drafts": 100, "num_draft_tokens": 300, "num_accepted_tokens": 150,
                 "accepted_per_pos": [70, 50, 30], "generation_tokens": 256}
    r = V.RunResult.from_counts(spec=d, run_id="code-edit-b1-c0-r0", model="qwen2.5-coder-1.5b", method="eagle",
                                k=3, batch_size=1, n_requests=1, prompt_len=100, output_tokens=256, wall_s=0.5,
                                output_tok_per_s=512.0)
    cfg = G.grid_specs("/h", model_dir="/m", draft_k=None)[1]["config"]
    eng = {"kind": "engine", "spec": "v2grid-eagle-k3", "config": cfg, "instrumented": False,
           "resolved": {"runner": "v2", "async_scheduling": True, "runner_source": "vllm_config"}}
    run = {"kind": "run", "spec": "v2grid-eagle-k3", "config": cfg, **r.to_dict(), "task": "hybrid",
           "workload": "code-edit", "repeat": 0, "chunk": 0}
    (row,) = G.grid_rows([eng, run, {"kind": "done", "spec": "v2grid-eagle-k3"}])
    assert row["acceptance_length"] == 2.5 and row["acceptance_rate"] == 0.5
    assert row["per_position_rate"] == [0.7, 0.5, 0.3] and row["vllm_generation_tokens"] == 256
    assert row["tok_s"] == 512.0
    assert (row["runner"], row["async_scheduling"], row["instrumented"]) == ("v2", True, False)
    assert (row["engine_config"], row["runner_forced"], row["runner_source"]) == ("default", None, "vllm_config")
    t = G.grid_table([row, {**row, "repeat": 1, "wall_s": 1.0}, {**row, "repeat": 2, "wall_s": 0.25}])
    assert t["repeats"].tolist() == [3] and t["tok_s_max"].tolist() == [1024.0] and t["runner"].tolist() == ["v2"]


def test_a_restarted_configuration_is_its_own_engine_and_steal_marks_contended_points(tmp_path):
    """Two engines of one configuration stay apart (``spec#n``); the ratio's baseline is the no-SD engine with the
    least steal, and a point whose runs lost CLEAN_STEAL of their wall time to the hypervisor is flagged."""
    import json

    def run(spec, method, wall, steal, rep=0):
        return {"kind": "run", "spec": spec, "config": {"method": method, "model_runner": "default"},
                "workload": "code-edit", "batch_size": 8, "repeat": rep, "chunk": 0, "k": 3,
                "output_tokens": 2048, "wall_s": wall, "host_steal_s": steal, "num_drafts": 10,
                "num_accepted_tokens": 15, "num_draft_tokens": 30}

    def eng(spec, method):
        return {"kind": "engine", "spec": spec, "config": {"method": method, "model_runner": "default"},
                "resolved": {"runner": "v2", "async_scheduling": True}}

    recs = [eng("n", "none"), *[run("n", "none", 1.0, 0.0, r) for r in range(3)],
            eng("e", "eagle"), *[run("e", "eagle", 0.5, 0.1, r) for r in range(3)],
            eng("n", "none"), *[run("n", "none", 1.5, 0.4, r) for r in range(3)]]
    rows = G.grid_rows(recs)
    assert sorted({r["engine"] for r in rows}) == ["e#1", "n#1", "n#2"]
    t = G.grid_table(rows)
    assert t.set_index("engine")["clean_repeats"].to_dict() == {"n#1": 3, "e#1": 0, "n#2": 0}
    r = G.ratio_table(t)
    assert r["none_engine"].tolist() == ["n#1"] and r["ratio"].tolist() == [2.0]
    assert r["contended"].tolist() == [True] and r["steal_share"].tolist() == pytest.approx([0.2])
    # summarize: the files, the engines in order, every file's sha256 in the manifest
    for name, part in (("a", recs[:8]), ("b", recs[8:])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in part))
    out = tmp_path / "out"
    assert G.summarize([tmp_path / "a", tmp_path / "b"], out) == {"runs": 9, "configurations": 2}
    man = json.loads((out / "MANIFEST.json").read_text())
    assert [e["spec"] for e in man["engines"]] == ["n", "e", "n"]
    assert sorted(k for k, v in man.items() if isinstance(v, dict) and "sha256" in v) == \
        ["ratios.csv", "results.jsonl.gz", "runs.csv", "table.csv"]
    with pytest.raises(FileNotFoundError, match="no such file"):
        G.summarize([tmp_path / "a", tmp_path / "nope"], tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_engines_resident_together_are_divided_by_their_own_no_sd_engine():
    """A group's EAGLE engine is divided by the group's no-SD engine (both took the host's epochs alike), even where
    a separately started no-SD engine ran with less steal; an engine started alone keeps that one as baseline."""
    def run(spec, method, wall, steal, group=None):
        return {"kind": "run", "spec": spec, "config": {"method": method, "model_runner": "default"},
                "workload": "code-edit", "batch_size": 1, "repeat": 0, "chunk": 0, "k": 3, "output_tokens": 256,
                "wall_s": wall, "host_steal_s": steal, "num_drafts": 10, "num_accepted_tokens": 15,
                "num_draft_tokens": 30, **({"group": group} if group else {})}

    def eng(spec, method):
        return {"kind": "engine", "spec": spec, "config": {"method": method, "model_runner": "default"},
                "resolved": {"runner": "v2", "async_scheduling": True}}

    g = "cogroup-n+e"
    recs = [eng("n", "none"), eng("e", "eagle"), run("n", "none", 1.0, 0.2, g), run("e", "eagle", 0.5, 0.1, g),
            eng("n", "none"), run("n", "none", 0.8, 0.0), eng("e", "eagle"), run("e", "eagle", 0.4, 0.05)]
    r = G.ratio_table(G.grid_table(G.grid_rows(recs)))
    assert r[["engine", "none_engine", "baseline"]].values.tolist() == [["e#1", "n#1", "co-resident"],
                                                                        ["e#2", "n#2", "separate"]]
    assert r["ratio"].tolist() == pytest.approx([2.0, 2.0])
    assert r["contended"].tolist() == [False, True]


def test_the_committed_grid_is_vllms_default_runner_uninstrumented():
    """data/gpu/v2grid: EAGLE and no SD on V2 with async scheduling, n-gram on V1 synchronous, none instrumented,
    every EAGLE k of the grid at every workload and batch size, 3 repeats each on the co-resident engines (n-gram's
    last point: 2, the lease's deadline cut the third; a second EAGLE k = 3 engine alone: code-edit bs 1, 2)."""
    import pandas as pd

    d = G.ROOT / "data" / "gpu" / "v2grid"
    t = pd.read_csv(d / "table.csv")
    runner = t.groupby("method")["runner"].unique().map(list).to_dict()
    assert runner == {"eagle": ["v2"], "ngram": ["v1"], "none": ["v2"]}
    assert not t["instrumented"].any() and (t["engine_config"] == "default").all()
    g = t[t["group"].notna()]
    e = g[g["method"] == "eagle"]
    assert sorted(e["k"].unique()) == [1, 2, 3, 5] and (g["repeats"] == 3).all()
    assert e.groupby("k").size().tolist() == [8, 8, 8, 8]        # 2 workloads x 4 batch sizes
    short = t[t["repeats"] != 3][["engine", "workload", "batch_size", "repeats"]].values.tolist()
    assert short == [["v2grid-eagle-k3#2", "code-edit", 1, 2], ["v2grid-ngram-k5#1", "sharegpt", 64, 2]]
    r = pd.read_csv(d / "ratios.csv")
    assert len(r) == 41 and (r["none_engine"] == r["group"].notna().map(
        {True: "v2grid-none-k0#1", False: "v2grid-none-k0#2"})).all()


def test_summarize_refuses_an_out_inside_its_raw_folder(tmp_path):
    from spec_repro.io import OutputError

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "results.jsonl").write_text("")
    with pytest.raises(OutputError, match="overlap"):
        G.summarize([tmp_path / "raw"], tmp_path / "raw" / "out")
    assert not (tmp_path / "raw" / "out").exists()


@pytest.mark.parametrize("case", ["inside", "same", "holds", "missing"])
def test_the_summarize_command_answers_bad_folders_in_one_line(tmp_path, capsys, case):
    """The command line: an --out overlapping a --raw folder, or a --raw without results.jsonl, gets one line on
    stderr and exit status 2 (no traceback), and nothing is written."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "results.jsonl").write_text("")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = {"inside": [str(raw), "--out", str(raw / "out")], "same": [str(raw), "--out", str(raw)],
            "holds": [str(raw), "--out", str(tmp_path)],
            "missing": [str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]}[case]
    assert G.main(["summarize", "--raw", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("v2grid summarize: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and ("results.jsonl" in err if case == "missing" else "overlap" in err)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_table_command_without_results_is_one_line(tmp_path, capsys):
    assert G.main(["table", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"v2grid table: no results.jsonl in {tmp_path}"
