"""What data/gpu holds, checked from the recorded H200 outputs (vLLM 0.25.0, spec_repro's step plugin):
step lines parse into the step schema, the phase shares and the cost-model fit come out of them, and vLLM's
SmolLM2 n-gram steps agree with predictions from the same greedy outputs."""
import json
from pathlib import Path

import pandas as pd
import pytest

from spec_repro import costmodel
from spec_repro.metrics import SHARE_COLUMNS
from spec_repro.engines.vllm import agreement as VA
from spec_repro.engines.vllm import steps as VS
from spec_repro.engines.vllm.plugin import prompt_hash
from spec_repro.traces import STEP_COLUMNS, read_steps

ROOT = Path(__file__).parents[1]
FIX = ROOT / "tests" / "fixtures" / "vllm"
GPU = ROOT / "data" / "gpu"


def test_recorded_plugin_lines_read_as_step_schema():
    df = read_steps(FIX / "steps_h200.jsonl")
    assert set(STEP_COLUMNS) <= set(df.columns)
    assert set(df["method"]) == {"none", "ngram", "eagle", "draft_model"}
    dec = df[df["phase"] == "decode"]
    # batch 4, k = 3: a decode step verifies each request's token plus its drafts (n-gram drafts only on a match)
    assert (dec["batched_tokens"] == dec["num_reqs"] + dec["num_draft_tokens"]).all()
    assert set(dec[dec.method.isin(["eagle", "draft_model"])]["batched_tokens"]) == {16}
    assert set(dec[dec.method == "none"]["batched_tokens"]) == {4}
    assert (dec["num_accepted_tokens"] <= dec["num_draft_tokens"]).all()
    # dummy weights: the repeating greedy output makes n-gram accept everything, EAGLE nothing
    ng = dec[dec.method == "ngram"]
    assert (ng["num_accepted_tokens"] == ng["num_draft_tokens"]).all()
    assert (dec[dec.method == "eagle"]["num_accepted_tokens"] == 0).all()
    parts = df[["t_draft", "t_verify", "t_reject", "t_other"]].sum(axis=1)
    assert (abs(parts - df["t_total"]) < 1e-9).all()
    assert (df.loc[df.method == "none", "t_draft"] == 0).all()


def test_plugin_v3_lines_are_consistent_step_to_step():
    """Plugin v3 reads each step's batch shape from vLLM's SchedulerOutput after the step (off the critical path).
    On the recorded H200 lines (n-gram, EAGLE-3, MTP, draft model; 1 and 2 GPUs) the shapes still agree with the
    outputs: from one decode step to the next every request's KV grows by 1 + the tokens it accepted."""
    df = read_steps(FIX / "steps_h200_v3.jsonl")
    assert set(df["method"]) == {"ngram", "eagle3", "mtp", "draft_model"}
    dec = df[df["phase"] == "decode"]
    assert (dec["batched_tokens"] == dec["num_reqs"] + dec["num_draft_tokens"]).all()
    assert (dec["num_accepted_tokens"] <= dec["num_draft_tokens"]).all()
    pairs = 0
    for _, g in df.sort_values("step").groupby("run_id"):
        g = g.reset_index(drop=True)
        for i in range(len(g) - 1):
            a, b = g.iloc[i], g.iloc[i + 1]
            if a.phase == b.phase == "decode" and b.step == a.step + 1 and a.num_reqs == b.num_reqs:
                assert b.kv_tokens - a.kv_tokens == a.num_reqs + a.num_accepted_tokens
                pairs += 1
    assert pairs > 150


def test_recorded_detail_lines_map_requests_by_prompt_hash():
    recs = VA.load_step_records(FIX / "steps_smollm2_detail.jsonl")
    prompts = {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(GPU / "smollm2_prompts.jsonl"))}
    new = {rid: v for r in recs for rid, v in (r.get("new_reqs") or {}).items()}
    assert new, "the first steps admit requests"
    by_hash = {prompt_hash(p): k for k, p in prompts.items()}
    assert all(h in by_hash and len(prompts[by_hash[h]]) == n for n, h in new.values())
    steps = VA.request_steps(recs, prompts)
    assert steps and all(pos >= 1 for rows in steps.values() for pos, _, _ in rows)


@pytest.fixture(scope="module")
def steps():
    return pd.read_parquet(GPU / "steps.parquet")


def test_verification_dominates_and_rejection_is_small(steps):
    pb = pd.read_csv(GPU / "phase_breakdown.csv")
    dec = pb[(pb.steps_kind == "decode") & pb.primary]
    llama = dec[dec.model == "llama31-8b"]
    assert set(llama.method) == {"none", "ngram", "eagle", "eagle3"}
    assert set(llama.session) == {"3-plugin-v3"}          # re-recorded with plugin v3; v1 kept, not primary
    assert set(llama.batch_size) == {1, 4, 16, 64, 256}
    # finding 2's shape: the target forward is the largest phase, rejection sampling is small
    assert (llama.verification_share > 0.5).all() and (llama.verification_share < 0.8).all()
    assert (dec.rejection_sampling_share < 0.03).all()
    shares = dec[list(SHARE_COLUMNS)].sum(axis=1)
    assert ((shares - 1).abs() < 5e-6).all()      # the CSV keeps 6 significant digits
    # the study's upper end: n-gram on Llama-3-70B (here tensor parallel 2) at B = 512 is ~90 % verification
    ng70 = dec[(dec.model == "llama3-70b") & (dec.method == "ngram")].set_index("batch_size")
    assert ng70.loc[512, "verification_share"] > 0.85 and (ng70.drafting_share < 0.02).all()
    # recomputing from the committed steps gives the committed table
    by = ["session", "spec", "primary", "model", "method", "k", "batch_size"]
    again = VS.phase_breakdown(steps[steps.run_kind == "study"], by=tuple(by))
    m = again.merge(pb[pb.steps_kind == "decode"], on=by, suffixes=("", "_c"))
    assert len(m) == len(pb[pb.steps_kind == "decode"])
    for c in SHARE_COLUMNS:
        assert (m[c] - m[f"{c}_c"]).abs().max() < 1e-6, c


def test_draft_model_cuda_graph_fix_cuts_drafting(steps):
    """vLLM 0.25's V1 runner never replays a draft model's CUDA graphs; the plugin's opt-in fix (vLLM PR #47460)
    does: same Qwen3-8B/0.6B dimensions, drafting time per step falls at every batch size."""
    pb = pd.read_csv(GPU / "phase_breakdown.csv")
    dec = pb[(pb.steps_kind == "decode") & (pb.model == "qwen3-8b") & (pb.method == "draft_model")]
    eager = dec[dec.spec == "qwen3-8b-draft"].set_index("batch_size")
    graphs = dec[dec.spec == "qwen3-8b-draft-cg"].set_index("batch_size")
    both = eager.index.intersection(graphs.index)
    assert len(both) >= 4 and not eager.primary.any() and graphs.primary.all()
    assert (graphs.loc[both, "draft_ms"] < 0.7 * eager.loc[both, "draft_ms"]).all()
    runs = pd.read_csv(GPU / "runs.csv")
    assert runs[runs.spec == "qwen3-8b-draft-cg"].draft_cudagraphs.all()


def test_decode_steps_sit_above_the_hbm_floor(steps):
    lim = pd.read_csv(GPU / "verify_limits.csv")
    assert (lim.bw_util < 1).all() and (lim.bw_util > 0).all()
    # without SD a decode forward stays within a small factor of its memory floor (dense and MoE, 1 or 2 GPUs)
    assert (lim[lim.method == "none"].bw_util > 0.25).all()
    one = lim[(lim.model == "llama31-8b") & (lim.method == "none") & (lim.batch_size == 1)].iloc[0]
    assert 3.1 < one.floor_ms < 3.2 and one.t_verify_ms > one.floor_ms


def test_h200_cost_model_fit(steps):
    l8 = steps[(steps.model == "llama31-8b") & (~steps.outlier) & (steps.session == "1-plugin-v1")]
    fr = costmodel.fit(l8.reset_index(drop=True), kinds={"eagle": "per_token", "ngram": "fraction"})
    assert fr.r2["target"] >= 0.98
    saved = costmodel.load_cost_model(GPU / "costmodel_llama31_8b_h200.json")
    assert saved.c_tok == pytest.approx(fr.model.c_tok) and saved.c0 == pytest.approx(fr.model.c0)
    h100 = costmodel.load_cost_model("llama3.1-8b-h100")
    # the H200 streams weights and KV faster (4.8 vs 3.35 TB/s): lower fixed and per-KV-token costs
    assert saved.c0 < h100.c0 and saved.c_kv < h100.c_kv


def test_overhead_table_from_runs():
    runs = pd.read_csv(GPU / "runs.csv")
    ov = VS.overhead_table(runs)
    committed = pd.read_csv(GPU / "overhead.csv")
    assert ov["overhead_mean"].round(6).tolist() == committed["overhead_mean"].round(6).tolist()
    v2 = ov[ov.session == "2-plugin-v2"]
    assert set(v2.batch_size) == {1, 64} and (v2.repeats == 4).all()
    v3 = ov[ov.session == "3-plugin-v3"].set_index("batch_size")
    assert (v3.repeats == 6).all() and (v3.overhead_mean <= 0.03).all()
    # the paired estimate (each repeat's on/off runs back to back) is the same quantity, with an interval
    assert ((v3.overhead_paired - v3.overhead_mean).abs() < 0.005).all() and (v3.overhead_paired_ci95 > 0).all()
    # alone on a one-GPU machine, B = 64: even the upper end of the 95 % interval is under 3 %
    quiet = ov[(ov.spec == "llama8b-none-overhead3") & (ov.batch_size == 64)].iloc[0]
    assert quiet.overhead_paired + quiet.overhead_paired_ci95 < 0.03


def test_smollm2_vllm_steps_agree_with_the_torch_profiler():
    steps, prompts, outputs = VA.load_smollm2_steps(GPU)
    assert len(steps) == len(prompts) == len(outputs) == 200
    r = VA.agreement(steps, prompts, outputs, k=8, predictor=VA.torch_profiler_predictor)
    assert r["steps_with_drafts"] > 4000 and r["drafted_steps_agreement_rate"] == 1.0
    assert r["accepted_agreement_rate"] == 1.0
    committed = json.loads((GPU / "smollm2_agreement.json").read_text())
    assert committed["vs_torch_profiler"]["steps"] == r["steps"]


def test_agreement_detects_a_wrong_count():
    steps, prompts, outputs = VA.load_smollm2_steps(GPU)
    key = next(k for k, rows in steps.items() if any(d > 0 and a > 0 for _, d, a in rows))
    i = next(i for i, (_, d, a) in enumerate(steps[key]) if d > 0 and a > 0)
    p, d, a = steps[key][i]
    bad = {key: steps[key][:i] + [(p, d, a - 1)] + steps[key][i + 1:]}
    r = VA.agreement(bad, prompts, outputs, k=8)
    assert r["accepted_agree"] == r["steps"] - 1
    assert r["mismatches"][0]["position"] == p


def test_load_raw_reads_device_outputs():
    from spec_repro.engines.vllm.summary import load_raw

    runs, steps, engines = load_raw(FIX)
    assert len(runs) == 5 and set(runs["session"]) == {"1-plugin-v1"}
    assert (runs["load_format"] == "dummy").all() and runs["acceptance_length"].between(3.9, 4.0).all()
    assert engines[0]["vllm"] == "0.25.0" and engines[0]["instrumented"]
    assert {"t_sched", "spec", "session"} <= set(steps.columns)
    assert (steps["t_sched"] <= steps["t_other"] + 1e-12).all()
