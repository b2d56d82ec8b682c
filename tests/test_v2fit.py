"""The V2 runner's cost model from the v2grid's wall times (``engines.vllm.v2fit``): a known model recovered from
runs built from it (leave-one-k-out included), contended runs left out, the committed preset and prediction table
regenerated from the committed runs, the simulator pricing a step as the fit does, and one clear error."""
import json

import numpy as np
import pandas as pd
import pytest

from spec_repro.costmodel import PRESETS, CostModel, CostModelError, Drafter, load_cost_model, same_fit
from spec_repro.engines.vllm import v2fit as V

TRUE = CostModel("true", 0.0, 6e-6, 2.0e-3, 0.0,
                 drafters={"eagle": Drafter("per_token", c_tok=2e-5, c0=3e-4, c_step=1.2e-3, c_step_req=2.5e-5,
                                            catch_up=1.0)})
AL = {"code-edit": 1.2, "sharegpt": 1.0}      # tokens accepted per draft at k = 1; more at larger k


def synth(model=TRUE, ks=(1, 2, 3, 5), steal=0.0, slow=1.0, engine="#1") -> pd.DataFrame:
    """Runs as v2grid writes them, built from ``model``: 256 output tokens a request, the prefill one step, EAGLE's
    requests all drafted the same number of times; ``slow`` scales every wall time, ``steal`` its steal share."""
    rows = []
    for w, a in AL.items():
        for B in (1, 8, 32, 64):
            for k in (0, *ks):
                D = 255 if k == 0 else round(255 / (1 + a * k ** 0.5))       # decode steps a request
                wall = slow * (1 + D) * float(V.step_time(model, B, k))
                for rep in range(3):
                    rows.append({"engine": f"v2grid-{'none' if k == 0 else 'eagle'}-k{k}{engine}",
                                 "method": "none" if k == 0 else "eagle", "k": k, "workload": w, "batch_size": B,
                                 "repeat": rep, "output_tokens": 256 * B, "wall_s": wall,
                                 "num_drafts": 0 if k == 0 else D * B,
                                 "num_accepted_tokens": 0 if k == 0 else (255 - D) * B,
                                 "host_steal_s": steal * wall, "steal_share": steal, "runner": "v2"})
    return pd.DataFrame(rows)


def coefs(m: CostModel) -> list[float]:
    d = m.drafters["eagle"]
    return [m.c_kv, m.c_tok, m.c0, m.overhead, d.c_kv, d.c_tok, d.c0, d.c_step, d.c_step_req]


def test_the_fit_recovers_a_known_model_and_each_k_is_predicted_without_its_runs():
    """Every term recovered, the per-request one (c_step_req) apart from the per-token ones, from all k and from
    each leave-one-k-out subset; then the per-token terms at 0 (drafting k-independent, as fitted on V2)."""
    runs = synth()
    m = V.fit_v2(runs)
    np.testing.assert_allclose(coefs(m), coefs(TRUE), rtol=1e-6, atol=1e-12)
    assert m.fit["eagle_k"] == [1, 2, 3, 5] and m.fit["points"] == {"none": 8, "eagle": 32}
    for k in (1, 2, 3, 5):
        loko = V.fit_v2(runs, drop_k=k)
        assert k not in loko.fit["eagle_k"] and loko.fit["left_out_k"] == k
        np.testing.assert_allclose(coefs(loko), coefs(TRUE), rtol=1e-6, atol=1e-12)
    t = V.prediction_table(runs)
    assert len(t) == 32 and not t["contended"].any()
    np.testing.assert_allclose(t[["ratio", "ratio_in_sample"]], 1.0, rtol=1e-6)
    flat = CostModel("flat", 0.0, 6e-6, 2.0e-3, 0.0, drafters={"eagle": Drafter(
        "per_token", c_step=1.4e-3, c_step_req=2.3e-5, catch_up=1.0)})
    runs = synth(flat, ks=(1, 2, 3))
    for k in (None, 1, 2, 3):
        np.testing.assert_allclose(coefs(V.fit_v2(runs, drop_k=k)), coefs(flat), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(V.prediction_table(runs)["ratio"], 1.0, rtol=1e-6)


def test_leave_one_k_out_does_not_see_the_k_it_predicts():
    """k = 3's runs 30% slower than the model: its leave-one-k-out prediction is the true model's (fitted on the
    other k), so it reads 1 / 1.3; the in-sample fit bends toward them."""
    runs = synth()
    k3 = runs["k"] == 3
    runs.loc[k3, "wall_s"] *= 1.3
    t = V.prediction_table(runs).query("k == 3")
    np.testing.assert_allclose(t["ratio"], 1 / 1.3, rtol=1e-6)
    np.testing.assert_allclose(t["t_pred_ms"], [1e3 * float(V.step_time(TRUE, b, 3)) for b in t["batch_size"]],
                               rtol=1e-6)
    assert (t["ratio_in_sample"] > 1 / 1.3 + 0.01).all()


def test_contended_runs_are_left_out_of_the_fit_and_flagged():
    clean = synth()
    runs = pd.concat([clean, synth(steal=0.2, slow=1.5, engine="#2")], ignore_index=True)
    assert coefs(V.fit_v2(runs)) == pytest.approx(coefs(V.fit_v2(clean)), rel=1e-9)
    t = V.prediction_table(runs)
    c = t[t["contended"]]
    assert len(c) == 32 and np.allclose(c["steal_share"], 0.2)
    np.testing.assert_allclose(c["ratio"], 1 / 1.5, rtol=1e-6)      # the named missed cost: steal


def test_no_uncontended_no_sd_runs_is_one_clear_error(tmp_path, capsys):
    runs = synth()
    runs.loc[runs["method"] == "none", "steal_share"] = 0.05
    with pytest.raises(CostModelError, match=r"no uncontended no-SD runs \(method 'none', steal share < 0.01\)"):
        V.fit_v2(runs)
    with pytest.raises(CostModelError, match="lack columns"):
        V.fit_v2(runs.drop(columns=["num_drafts"]))
    runs.to_csv(tmp_path / "runs.csv", index=False)
    rc = V.main(["fit", "--runs", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "p.json"),
                 "--table", str(tmp_path / "t.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no uncontended no-SD runs" in err
    assert not (tmp_path / "p.json").exists()


def test_the_committed_preset_and_table_are_the_fit_of_the_committed_runs(tmp_path):
    assert PRESETS[V.NAME] == V.PRESET
    m = load_cost_model(V.NAME)
    assert same_fit(m.to_dict(), V.fit_v2().to_dict())
    assert (V.v2grid_dir() / "predicted.csv").read_text() == V.prediction_table().to_csv(index=False,
                                                                                       float_format="%.6g")
    for words in ("vLLM 0.25.0", "V2 model runner", "async scheduling", "real weights", "one NVIDIA H200",
                  "uncontended runs only", "steal share < 0.01", "num_drafts / B", "k = 1, 2, 3"):
        assert words in m.source, words
    assert "V2 runner (vLLM's default)" in m.hardware and m.drafter("eagle").kind == "per_token"
    out, table = tmp_path / "p.json", tmp_path / "t.csv"            # writing twice: the same bytes
    V.main(["fit", "--out", str(out), "--table", str(table)])
    first = out.read_bytes(), table.read_bytes()
    assert V.main(["fit", "--out", str(out), "--table", str(table), "--check"]) == 0
    V.main(["fit", "--out", str(out), "--table", str(table)])
    assert (out.read_bytes(), table.read_bytes()) == first
    assert json.loads(first[0]) == json.loads(V.PRESET.read_text())


def test_the_simulator_prices_a_batch_step_as_the_fit_does():
    """Mixed batching of 8 identical requests (and duplicate batching of 8 copies), fixed-3 EAGLE accepting 2 of 3:
    a prefill step, then 85 decode steps of 8 requests verifying 4 tokens each, each priced ``step_time(model, 8,
    3)``; no SD: 255 of ``step_time(8, 0)``."""
    from spec_repro.simulate import simulate
    from spec_repro.traces import Trace

    from dataclasses import replace

    m = load_cost_model(V.NAME)
    # every term of the fit's drafter priced, whatever the committed fit gives (a per-step and a per-request term)
    m.drafters["eagle"] = replace(m.drafter("eagle"), c_step=1.4e-3, c_step_req=2.3e-5)
    P = 100
    t = Trace.from_arrays({f"r{i}": {"eagle": [3] * 256} for i in range(8)}, prompt_lens={f"r{i}": P for i in range(8)},
                          dataset="d", model="m", k_max=3)
    pre = float(m.forward(0.0, 8 * P)) + m.overhead
    for batching in ("mixed", "duplicate"):     # duplicate: one request's 8 copies, the same steps
        r = simulate(t, m, "eagle", "fixed-3", batch_sizes=(8,), batching=batching, progress=False).iloc[0]
        assert r["sd_time_s"] == pytest.approx(pre + 85 * float(V.step_time(m, 8, 3)), rel=1e-12)
        assert r["base_time_s"] == pytest.approx(pre + 255 * float(V.step_time(m, 8, 0)), rel=1e-12)
