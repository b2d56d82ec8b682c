"""Issue 18's H200 session: the async step reconstruction (a recorded fixture) and the committed data/gpu/live
tables (runs.csv's engine_config, the Llama baseline, the agreement numbers the closing note quotes)."""
import json
from pathlib import Path

import pytest

from spec_repro.engines.vllm import agreement as A
from spec_repro.engines.vllm import live, session
from spec_repro.paths import data_dir

FX = Path(__file__).parent / "fixtures" / "vllm" / "async_eagle_steps.json"
LIVE = data_dir() / "gpu" / "live"


@pytest.fixture(scope="module")
def fx():
    return json.loads(FX.read_text())


def test_async_steps_are_read_back_from_the_next_steps(fx):
    steps = A.request_steps(fx["records"], fx["prompts"])
    assert set(steps) == set(fx["prompts"])
    for key, rows in steps.items():
        raw = [v for r in fx["records"] for v in r["req_info"].values()]
        pos = [p for p, _, _ in rows]
        assert pos[0] == 1 and all(b > a for a, b in zip(pos, pos[1:]))
        assert all(0 <= acc <= d == fx["k"] for _, d, acc in rows)
        # each step yields accepted + 1 tokens: the true positions are walked exactly
        assert all(pos[i + 1] == pos[i] + rows[i][2] + 1 for i in range(len(rows) - 1))
        assert pos[-1] <= len(fx["outputs"][key])
    # the optimistic positions as logged would not walk (they lead by the previous step's k + 1 tokens)
    logged = {}
    for r in fx["records"]:
        for rid, (p, ns, nd) in r["req_info"].items():
            if p > 0 and ns == 1 + nd:
                logged.setdefault(rid, []).append(p)
    assert any(seq[1] - seq[0] == fx["k"] + 1 for seq in logged.values())


def test_async_steps_agree_with_the_profiler(fx):
    steps = A.request_steps(fx["records"], fx["prompts"])
    pred = session.predictor_from_acc(fx["predictions"], fx["prompts"])
    rep = A.agreement(steps, fx["prompts"], fx["outputs"], k=fx["k"], predictor=pred)
    assert rep["steps"] > 60 and rep["unpredicted_steps"] == 0
    assert rep["accepted_agreement_rate"] >= 0.9
    # read as the synchronous path reads them (the logged positions), the same steps would not agree
    sync = [{**r, "outputs_known": True} for r in fx["records"]]
    naive = A.agreement(A.request_steps(sync, fx["prompts"]), fx["prompts"], fx["outputs"], k=fx["k"], predictor=pred)
    assert naive["accepted_agreement_rate"] < 0.5


def test_committed_agreement_meets_the_issue():
    rep = json.loads((LIVE / "qwen_agreement.json").read_text())
    rate = {v["proposer"]: v["vs_profiler"]["accepted_agreement_rate"] for v in rep.values()}
    assert rate["eagle"] >= 0.97 and rate["ngram"] >= 0.99 and rate["draft"] >= 0.97
    assert rep["hybrid-default-ngram"]["vs_replica"]["accepted_agreement_rate"] == 1.0


def test_runs_name_their_engine_config():
    import pandas as pd

    runs = pd.read_csv(LIVE / "runs.csv")
    assert set(runs["engine_config"]) == {"default", "study-like"}
    llama = runs[runs["model"] == "llama31-8b"]
    assert set(llama["engine_config"]) == {"default", "study-like"}
    assert not llama.loc[llama["engine_config"] == "default", "instrumented"].any()


def test_llama_default_baseline_beats_the_study_like_one():
    b = live.llama_baseline(LIVE).set_index("batch_size")
    for bs in (1, 16, 64, 256):
        assert b.loc[bs, "default"] > 1.2 * b.loc[bs, "study_like"]
        assert b.loc[bs, "default"] < b.loc[bs, "floor_tok_s"]
    # the committed n-gram speedup (dummy weights) read against today's default engine is smaller
    assert b.loc[1, "ngram_vs_default"] < b.loc[1, "ngram_vs_committed"]


def test_throughput_spread_and_floor():
    t = live.throughput(out=LIVE)
    assert (t["repeats"] == 3).all()
    assert ((t["tok_s_min"] <= t["tok_s"]) & (t["tok_s"] <= t["tok_s_max"])).all()
    assert (t["share_of_ceiling"] < 1).all()
