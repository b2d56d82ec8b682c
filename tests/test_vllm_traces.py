"""The vLLM decoding path's CPU-checkable parts: leak-free training splits by source, token ids stored compactly
in traces (and old files still read), the n-gram profile recomputed from the stored ids, the profiler over outputs
decoded elsewhere, and one clear line where ``--engine vllm`` cannot run."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spec_repro import workloads as wl
from spec_repro.profiler import ngram_acceptance
from spec_repro.traces import Trace
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]
QWEN = sorted((ROOT / "data" / "traces").glob("qwen2.5-coder-1.5b__*.parquet"))


# ---- splits by source -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _records_read_once():
    """Each workload's records read from the cache (and their sha256 checked) once for this module, not once per
    ``load``: the splits below load the evaluation sets once per workload and sharegpt-turns (156 MB) three times.
    Reading the cache is tested in test_workloads.py and test_bad_input.py; here only what is done with the
    records is (each call gets its own list of the same records, as from a fresh read)."""
    cache = {}
    real = wl.records

    def once(name):
        if name not in cache:
            cache[name] = real(name)
        return list(cache[name])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(wl, "records", once)
        yield


@pytest.fixture(scope="module", autouse=True)
def _eval_requests_once():
    """The evaluation requests (1,144 prompts, tokenized) made once per set of arguments for this module:
    ``split_by_source`` makes them again at every call (ten calls below), always the same requests for the same
    arguments (the first call runs the real function, ``held`` below included); each call gets its own list."""
    from spec_repro import train

    cache = {}
    real = train.eval_requests

    def once(*, tokenizer, eval_sets=None, seed=0, max_prompt_tokens=1024):
        key = (id(tokenizer), json.dumps(eval_sets, sort_keys=True), seed, max_prompt_tokens)
        if key not in cache:
            cache[key] = (tokenizer, real(tokenizer=tokenizer, eval_sets=eval_sets, seed=seed,
                                          max_prompt_tokens=max_prompt_tokens))
        return list(cache[key][1])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(train, "eval_requests", once)
        yield


@pytest.fixture(scope="module")
def tok():
    from spec_repro import models

    return models.load("smollm2-135m")[1]


@pytest.fixture(scope="module")
def held(tok):
    from spec_repro.train import eval_requests

    return eval_requests(tokenizer=tok)


def test_split_is_prefix_stable_and_a_continued_head_holds_out_only_unseen_prompts(tok, tmp_path):
    """What ``--init-head`` rests on: a workload's training requests under a smaller cap are the first ones under a
    larger cap (so an earlier run's record of how many it took names exactly which), and the held-out decodes of a
    continued run are drawn only from prompts that run never decoded; a record of another split is refused."""
    from spec_repro.train import EVAL_SETS, _hold_out, _taken_by, split_by_source

    small, _ = split_by_source(["py-write", "gsm-symbolic"], train_n=40, tokenizer=tok)
    large, _ = split_by_source(["py-write", "gsm-symbolic"], train_n=70, tokenizer=tok, train_n_for={"py-write": 90})
    for w in small:
        assert [r.prompt_text for r in large[w][:40]] == [r.prompt_text for r in small[w]]
    head = tmp_path / "h"
    head.mkdir()
    rec = {"settings": {"seed": 0}, "data": {"workloads": {"py-write": {"train_requests": 40}, "sharegpt": {
        "train_requests": 9}, "eval_sets": dict(EVAL_SETS)}}}
    (head / "TRAINING.json").write_text(json.dumps(rec))
    taken = _taken_by(head, large, seed=0, eval_sets=EVAL_SETS, max_prompt_tokens=1024)
    assert taken == {"py-write": 40}                     # gsm-symbolic: never decoded by that run
    fresh = [i >= taken.get(w, 0) for w in large for i in range(len(large[w]))]
    assert len(large["py-write"]) == 90 and sum(fresh) == 90 - 40 + len(large["gsm-symbolic"])
    val = _hold_out(fresh, 55)
    assert len(val) == 55 and all(fresh[j] for j in val) and not any(j < 40 for j in val)
    assert _hold_out([True] * 10, 3) == {0, 1, 2}        # no init head: the first val_n, as before
    assert _taken_by(None, large, seed=0, eval_sets=EVAL_SETS, max_prompt_tokens=1024) == {}
    with pytest.raises(ValueError, match="seed 0, this run's is 1"):
        _taken_by(head, large, seed=1, eval_sets=EVAL_SETS, max_prompt_tokens=1024)
    with pytest.raises(ValueError, match="max_prompt_tokens 1024"):
        _taken_by(head, large, seed=0, eval_sets=EVAL_SETS, max_prompt_tokens=512)


def test_eval_requests_are_what_collect_profiles(held):
    counts = {w: sum(r.dataset == w for r in held) for w in ("sharegpt", "code-edit", "gsm-symbolic", "humaneval",
                                                              "mt-bench")}
    assert counts == {"sharegpt": 400, "code-edit": 300, "gsm-symbolic": 300, "humaneval": 164, "mt-bench": 80}


@pytest.mark.parametrize("workload", ["sharegpt", "sharegpt-turns", "py-functions", "py-write", "code-edit",
                                      "humaneval", "gsm-symbolic", "mt-bench"])
def test_training_split_shares_no_source_with_any_evaluation_request(tok, held, workload):
    """Every workload that has sources: training never sees an evaluation request's HumanEval task, ShareGPT
    conversation, gsm-symbolic template or prompt; where every source is taken by evaluation, nothing is left."""
    from spec_repro.train import split_by_source

    banned = {wl.source_key(r) for r in held}
    texts = {r.prompt_text for r in held}
    if workload in ("code-edit", "humaneval", "mt-bench"):
        # humaneval's 164 evaluation requests are every HumanEval task (code-edit's sources too); mt-bench's 80
        # are all of it
        with pytest.raises(ValueError, match="no request whose source is outside the evaluation sets"):
            split_by_source([workload], train_n=10**6, tokenizer=tok)
        return
    split, facts = split_by_source([workload], train_n=10**6, tokenizer=tok)
    train = split[workload]
    keys = {wl.source_key(r) for r in train}
    assert len(train) > (1000 if workload in ("sharegpt", "sharegpt-turns", "py-functions") else
                         800 if workload == "py-write" else 0)
    assert not keys & banned and not {r.prompt_text for r in train} & texts
    assert len({r.prompt_text for r in train}) == len(train)
    if workload == "sharegpt":   # conversations split into parts share a key: a part of an eval conversation is out
        assert facts["sharegpt"]["dropped_sharing_an_eval_source"] >= 300
    if workload == "sharegpt-turns":   # evaluation conversations have later turns, and every one of them is out
        assert len({wl.source_key(r) for r in wl.load("sharegpt-turns")} & banned) > 100
        assert facts["sharegpt-turns"]["dropped_sharing_an_eval_source"] > 100


def test_source_keys_name_the_origin(tok):
    ce = wl.load("code-edit", n=3)
    assert all(wl.source_key(r) == f"humaneval:{r.meta['task_id']}" for r in ce)
    assert wl.source_key(wl.load("humaneval", n=1)[0]).startswith("humaneval:HumanEval/")
    g = wl.load("gsm-symbolic", n=2)
    assert all(wl.source_key(r) == f"gsm-symbolic:template{r.meta['template']}" for r in g)
    s = wl.load("sharegpt", n=50)           # a conversation's source: its own id, or a copy's it shares content with
    assert all(wl.source_key(r) == "sharegpt:" + r.meta["source"] for r in s)
    assert sum(r.meta["source"] == r.id.split("/", 1)[1].split("#")[0].rsplit("_", 1)[0] for r in s) > 40
    first = {r.id.split("/", 1)[1].rsplit("_", 1)[0]: wl.source_key(r) for r in wl.load("sharegpt")
             if "#" not in r.id}                                   # a later turn: its conversation's key
    turns = [r for r in wl.load("sharegpt-turns") if r.id.split("/", 1)[1].rsplit("_", 1)[0] in first]
    assert len(turns) > 20_000
    assert all(wl.source_key(r) == first[r.id.split("/", 1)[1].rsplit("_", 1)[0]] for r in turns)
    assert wl.source_key(wl.load("py-functions", n=1)[0]).startswith("networkx:networkx.")
    fn = {wl.source_key(r) for r in wl.load("py-functions")}       # a function is one source in both workloads
    assert all(wl.source_key(r) == r.meta["task_id"] and r.meta["task_id"] in fn for r in wl.load("py-write"))


# ---- token ids in parquet traces ------------------------------------------------------------------------------
def test_token_ids_are_list_columns_and_round_trip(tmp_path):
    import pyarrow.parquet as pq

    info = {"a": {"prompt_token_ids": [1, 2, 3, 4, 5], "output_token_ids": [6, 7, 8, 9]},
            "b": {"prompt_token_ids": [1, 2, 3], "output_token_ids": [4, 5]}}
    t = Trace.from_arrays({"a": {"ngram": [3, 1, 1, 1], "eagle": [2, 2, 1, 1]}, "b": {"ngram": [1, 1], "eagle": [2, 1]}},
                          prompt_lens={"a": 5, "b": 3}, dataset="x", model="m", k_max=4, request_info=info)
    f = t.to_parquet(tmp_path / "t.parquet")
    schema = pq.read_schema(f)
    assert str(schema.field("output_token_ids").type) == "list<element: int32>"
    assert not any(b"token_ids" in v for v in schema.metadata.values() if b"{" in v[:2])   # not duplicated as JSON
    u = read_trace(f)
    got = u.requests.set_index("request_id")
    for rid, v in info.items():
        assert list(got.loc[rid, "prompt_token_ids"]) == v["prompt_token_ids"]
        assert list(got.loc[rid, "output_token_ids"]) == v["output_token_ids"]
    assert list(u.acc.columns) == list(t.acc.columns)
    u.to_parquet(tmp_path / "u.parquet")                                  # and again, byte for byte
    assert (tmp_path / "u.parquet").read_bytes() == f.read_bytes()


def test_old_traces_with_ids_in_json_still_read():
    import pyarrow.parquet as pq

    old = ROOT / "tests" / "fixtures" / "old_trace" / "smollm2-135m__mt-bench.parquet"   # the earlier layout
    assert "prompt_token_ids" not in pq.read_schema(old).names
    t = read_trace(old)
    assert len(t.requests) == 2 and "prompt_len" in t.requests
    assert [len(x) for x in t.requests.prompt_token_ids] == t.requests.prompt_len.tolist()


@pytest.mark.skipif(not QWEN, reason="no committed Qwen traces")
@pytest.mark.parametrize("path", QWEN, ids=lambda p: p.stem.split("__")[1])
def test_ngram_recomputed_from_stored_ids_equals_stored_acc_len(path):
    t = read_trace(path)
    if "output_token_ids" not in t.requests or t.requests["output_token_ids"].isna().any():
        pytest.skip(f"{path.name} carries no token ids")
    st = t.meta.get("proposers", {}).get("ngram", {})
    k_max = int(t.acc.k_max.iloc[0])
    acc = t.acc[t.acc.proposer == "ngram"].sort_values(["request_id", "position"])
    stored = {rid: g["acc_len"].to_numpy() for rid, g in acc.groupby("request_id", observed=True)}
    n_pos = 0
    for r in t.requests.itertuples():
        a, _ = ngram_acceptance(list(r.prompt_token_ids), list(r.output_token_ids), k_max, st.get("min_n", 3),
                                st.get("max_n", 7))
        np.testing.assert_array_equal(a[: len(stored[r.request_id])], stored[r.request_id], err_msg=r.request_id)
        n_pos += len(stored[r.request_id])
    assert n_pos == len(acc)


# ---- --engine vllm where it cannot run -----------------------------------------------------------------------
def _cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "spec_repro.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("cmd", [["collect", "--workloads", "mt-bench", "-n", "1", "--engine", "vllm",
                                  "--device", "cuda", "--out", "tr"],
                                 ["train", "eagle", "--engine", "vllm", "--device", "cuda", "--out", "head"]])
def test_engine_vllm_without_vllm_is_one_line_and_writes_nothing(tmp_path, cmd):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    r = _cli(cmd, tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines == ["error: --engine vllm needs vLLM (pip install 'spec-repro[vllm]' on a GPU host); the torch "
                     "engine (--engine torch, the default) runs anywhere"], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_engine_vllm_without_a_gpu_or_on_the_cpu_is_refused(monkeypatch):
    import importlib.util

    import torch

    from spec_repro.engines.vllm import decode as vllm_decode

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "vllm" else real(n, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(vllm_decode.EngineError, match="needs a CUDA GPU and none is visible"):
        vllm_decode.check_engine("vllm", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(vllm_decode.EngineError, match="--device cpu would profile elsewhere"):
        vllm_decode.check_engine("vllm", "cpu")
    with pytest.raises(vllm_decode.EngineError, match="unknown --engine 'tpu'"):
        vllm_decode.check_engine("tpu")
    vllm_decode.check_engine("vllm", "cuda")          # both present: accepted


def test_compare_engines_needs_vllm(tmp_path):
    r = _cli(["collect", "--workloads", "mt-bench", "-n", "1", "--compare-engines", "4", "--out", "tr"], tmp_path)
    assert r.returncode != 0 and r.stderr.strip() == "error: --compare-engines compares vLLM with the torch engine: " \
        "it needs --engine vllm"
    assert list(tmp_path.iterdir()) == []


# ---- the profiler over outputs decoded elsewhere --------------------------------------------------------------
def test_profile_decoded_equals_the_profile_of_its_own_decode():
    """Teacher-forced profiling of given outputs (what follows a vLLM decode) gives the acceptance the profiler
    finds with its own greedy decode, for n-gram, a draft model and early exit (tiny random Llama)."""
    from _tiny import prompts, tiny_llama

    from spec_repro.collect import build_proposers
    from spec_repro.profiler import profile_decoded, profile_requests

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    props = build_proposers(["ngram", "early-exit", "draft"], target, draft_model=drafter, early_exit_layers=1)
    ps = prompts()[:3]
    own = next(iter(profile_requests(target, ps, props, k_max=6, max_new_tokens=30, batch_size=3, eos_token_ids=[])))
    ext = profile_decoded(ps, [p.output_token_ids for p in own], props, k_max=6)
    for a, b in zip(own, ext):
        assert a.output_token_ids == b.output_token_ids and a.acc == b.acc and a.draft_len == b.draft_len


def test_provenance_names_where_outputs_were_decoded_and_where_profiled():
    """A Qwen trace profiled again in place names both machines: the last write's GPU (the draft model and early
    exit on an H100) and the decode's (vLLM on an H200); a trace decoded in one collect names one."""
    from spec_repro import analysis as A

    lines = {ln.split(":")[0].strip(): ln for ln in A.trace_provenance(A.load_traces(
        [ROOT / "data" / "traces" / f"qwen2.5-coder-1.5b__{w}.parquet" for w in ("code-edit", "sharegpt")])).splitlines()}
    edit, share = lines["qwen2.5-coder-1.5b__code-edit.parquet"], lines["qwen2.5-coder-1.5b__sharegpt.parquet"]
    assert "vllm on cuda (NVIDIA H100 80GB HBM3, 16 cores" in edit
    assert edit.endswith("; outputs decoded 2026-12-01 on NVIDIA H200, draft, eagle, early-exit profiled since")
    assert "NVIDIA H100" in share and "decoded 2026" not in share and "53 of 400 decoded outputs under 32" in share
