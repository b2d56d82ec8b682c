"""The trace schema and its readers: round trips, the published JSON-lines format, and clear errors."""
import json

import numpy as np
import pandas as pd
import pytest

from spec_repro.published import read_published_jsonl
from spec_repro.traces import (ACC_COLUMNS, Trace, TraceError, dataset_from_path,
                               read_steps, validate_steps)
from spec_repro.tracefiles import read_trace, read_traces


def _trace(**kw):
    arrays = {"r0": {"ngram": [1, 4, 2, 1, 1], "eagle": [2, 2, 3, 1, 1, 2]},
              "r1": {"ngram": [3, 1, 1], "eagle": [1, 2, 2]}}
    return Trace.from_arrays(arrays, prompt_lens={"r0": 7, "r1": 4}, dataset="code-edit", model="m",
                             draft_lens={"r0": {"ngram": [0, 3, 3, 0, 3]}}, **kw)


def _write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_from_arrays_cuts_to_shortest_and_infers_kmax():
    t = _trace()
    assert list(t.acc.columns) == list(ACC_COLUMNS)
    r0 = t.acc[t.acc.request_id == "r0"]
    assert set(r0.groupby("proposer").size()) == {5}  # eagle's 6 entries cut to ngram's 5
    assert (r0.output_len == 5).all() and (r0.prompt_len == 7).all()
    assert int(t.acc.k_max.iloc[0]) == 3  # max acc_len 4 -> k_max 3
    dl = t.acc[(t.acc.request_id == "r0") & (t.acc.proposer == "ngram")].draft_len.tolist()
    assert dl == [0, 3, 3, 0, 3]
    assert t.acc[t.acc.proposer == "eagle"].draft_len.isna().all()
    np.testing.assert_array_equal(t.arrays("ngram")[("code-edit", "m", "r1")], [3, 1, 1])


def test_parquet_round_trip_keeps_requests_and_meta(tmp_path):
    t = _trace(request_info={"r0": {"prompt_token_ids": list(range(7)), "output_text": "hi"}},
               meta={"source": "unit"})
    u = read_trace(t.to_parquet(tmp_path / "x.parquet"))
    pd.testing.assert_frame_equal(u.acc, t.acc)
    assert u.meta["source"] == "unit"
    r0 = u.requests.set_index("request_id").loc["r0"]
    assert list(r0.prompt_token_ids) == list(range(7)) and r0.output_text == "hi"
    assert not list(tmp_path.glob("*.tmp"))


def test_published_round_trip(tmp_path):
    t = _trace()
    p = t.to_published_jsonl(tmp_path / "combined_code-edit.jsonl")
    u = read_trace(p, model="m")
    assert u.datasets == ["code-edit"] and u.proposers == ["eagle", "ngram"]
    for prop in ("ngram", "eagle"):
        assert {k[2]: v.tolist() for k, v in u.arrays(prop).items()} == \
               {k[2]: v.tolist() for k, v in t.arrays(prop).items()}


def test_published_accepts_json_string_lists_and_single_acc(tmp_path):
    p = _write_jsonl(tmp_path / "combined_instructcoder.jsonl", [
        {"id": 1, "prompt_token_ids": [1, 2, 3], "generated_token_ids": [5, 6, 7],
         "acc_ngram": {"acc_len": "[1, 3, 1]"}, "acc_eagle": {"acc_len": [2, 1, 1]}},
        {"id": 2, "prompt_token_ids": [1], "generated_token_ids": [],
         "acc_ngram": {"acc_len": []}, "acc_eagle": {"acc_len": []}},  # empty: skipped
    ])
    t = read_published_jsonl(p)
    assert t.datasets == ["instructcoder"]
    assert t.meta["skipped_empty"] == ["2"]
    assert t.arrays("ngram")[("instructcoder", "unknown", "1")].tolist() == [1, 3, 1]
    q = _write_jsonl(tmp_path / "sharegpt_eagle.jsonl",
                     [{"id": "a", "prompt_token_ids": [1], "generated_token_ids": [1, 2], "acc": {"acc_len": [1, 2]}}])
    assert read_trace(q).proposers == ["eagle"]
    r = _write_jsonl(tmp_path / "cnn.jsonl",
                     [{"id": "a", "prompt_token_ids": [1], "generated_token_ids": [1, 2], "acc": {"acc_len": [1, 2]}}])
    with pytest.raises(TraceError, match="proposer"):
        read_trace(r)
    assert read_trace(r, proposer="ngram").proposers == ["ngram"]


@pytest.mark.parametrize("bad, match", [
    ({"acc_ngram": {"acc_len": 5}}, "list of ints"),
    ({"acc_ngram": {"acc_len": [1, 0, 2]}}, r"acc_len\[1\] = 0 < 1"),
    ({"acc_ngram": {"acc_len": [1, "x"]}}, "only ints"),
    ({"acc_ngram": {"acc_len": "[1, 2"}}, "not a JSON list"),
    ({"acc_ngram": {"len": [1, 2]}}, "no 'acc_len'"),
    ({}, "no acceptance key"),
])
def test_published_malformed_inputs_raise_clear_errors(tmp_path, bad, match):
    rec = {"id": 0, "prompt_token_ids": [1, 2], "generated_token_ids": [3, 4, 5], **bad}
    p = _write_jsonl(tmp_path / "combined_x.jsonl", [rec])
    with pytest.raises(TraceError, match=match) as e:
        read_trace(p)
    assert "combined_x.jsonl:1" in str(e.value)  # names the file and line


def test_published_length_mismatch_cuts_to_shortest_or_raises_when_strict(tmp_path):
    # as in the released files: acc_ngram matches the output, acc_eagle (EAGLE's own run) is longer
    rec = {"id": 0, "prompt_token_ids": [1, 2], "generated_token_ids": [3, 4, 5],
           "acc_ngram": {"acc_len": [1, 2, 1]}, "acc_eagle": {"acc_len": [1, 2, 1, 1, 1, 1, 1]}}
    p = _write_jsonl(tmp_path / "combined_x.jsonl", [rec])
    t = read_trace(p)
    assert t.meta["length_mismatch"] == 1
    assert t.arrays("eagle")[("x", "unknown", "0")].tolist() == [1, 2, 1]
    with pytest.raises(TraceError, match=r"combined_x.jsonl:1: length mismatch, 7 acceptance entries"):
        read_trace(p, strict=True)


def test_own_schema_length_mismatch():
    t = _trace()
    with pytest.raises(TraceError, match="length mismatch"):
        Trace(t.acc.drop(index=2), t.requests)  # a hole in r0's positions
    acc = t.acc.copy()
    acc["output_len"] = acc["output_len"] + 1
    with pytest.raises(TraceError, match="length mismatch"):
        Trace(acc, t.requests)


def test_published_file_level_errors(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="empty trace file"):
        read_trace(tmp_path / "e.jsonl")
    (tmp_path / "j.jsonl").write_text("{not json}\n")
    with pytest.raises(TraceError, match="j.jsonl:1: not JSON"):
        read_trace(tmp_path / "j.jsonl")
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(tmp_path / "t.csv")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TraceError, match="not a readable parquet"):
        read_trace(tmp_path / "bad.parquet")


def test_unknown_proposer_and_select():
    t = _trace()
    with pytest.raises(TraceError, match=r"unknown proposer.*'medusa'.*\['eagle', 'ngram'\]"):
        t.check_proposers(["ngram", "medusa"])
    s = t.select(proposers=["ngram"])
    assert s.proposers == ["ngram"] and len(s.requests) == 2
    assert len(t.select(dataset="nope").acc) == 0


def test_schema_rejects_bad_values():
    t = _trace()
    acc = t.acc.copy()
    acc.loc[0, "acc_len"] = 0
    with pytest.raises(TraceError, match=">= 1"):
        Trace(acc, t.requests)
    with pytest.raises(TraceError, match="missing columns"):
        Trace(t.acc.drop(columns=["position"]), t.requests)
    with pytest.raises(TraceError, match="exceeds k_max"):
        Trace.from_arrays({"a": {"ngram": [1, 9]}}, prompt_lens={"a": 1}, dataset="d", model="m", k_max=3)


def test_k_max_defaults_to_the_longest_draft_drafted_or_accepted():
    """Without ``k_max``: the longest draft the trace shows, a drafted length where nothing that long was accepted
    (low acceptance: sharegpt's profiles draft 8 and accept at most 7), else the longest acceptance; an explicit
    ``k_max`` below a drafted length is still an error."""
    kw = dict(prompt_lens={"a": 3}, dataset="d", model="m")
    t = Trace.from_arrays({"a": {"ngram": [3, 1, 2], "eagle": [2, 2, 1]}}, **kw, draft_lens={"a": {"ngram": [8, 0, 5]}})
    assert set(t.acc["k_max"]) == {8}
    assert set(Trace.from_arrays({"a": {"ngram": [3, 1, 2]}}, **kw, draft_lens={"a": {"ngram": [1, 0, 1]}})
               .acc["k_max"]) == {2}
    assert set(Trace.from_arrays({"a": {"ngram": [3, 1, 2]}}, **kw).acc["k_max"]) == {2}
    with pytest.raises(TraceError, match="draft_len must lie"):
        Trace.from_arrays({"a": {"ngram": [3, 1, 2]}}, **kw, draft_lens={"a": {"ngram": [8, 0, 5]}}, k_max=4)


def test_concat_rejects_duplicates_and_dataset_default(tmp_path):
    t = _trace()
    with pytest.raises(TraceError, match="duplicate"):
        Trace.concat([t, t])
    a = t.to_parquet(tmp_path / "a.parquet")
    both = read_traces([a, t.to_published_jsonl(tmp_path / "combined_other.jsonl")], model="m")
    assert both.datasets == ["code-edit", "other"]
    assert dataset_from_path("x/combined_gsm8k.jsonl") == "gsm8k"
    assert dataset_from_path("smollm2-135m__code-edit.parquet") == "smollm2-135m__code-edit"


def _steps(**over):
    row = {"run_id": "r", "engine": "vllm", "model": "m", "method": "ngram", "k": 3, "batch_size": 1, "step": 0,
           "num_reqs": 1, "batched_tokens": 4, "kv_tokens": 100, "t_draft": 1e-4, "t_verify": 5e-3,
           "t_reject": 1e-5, "t_other": 1e-3, "t_total": 1e-4 + 5e-3 + 1e-5 + 1e-3,
           "num_draft_tokens": 3, "num_accepted_tokens": 2}
    row.update(over)
    return pd.DataFrame([row])


def test_steps_validation(tmp_path):
    assert len(validate_steps(_steps())) == 1
    with pytest.raises(TraceError, match="!= t_total"):
        validate_steps(_steps(t_total=1.0))
    with pytest.raises(TraceError, match="finite and >= 0"):
        validate_steps(_steps(t_draft=-1.0))
    with pytest.raises(TraceError, match="accepted tokens exceed"):
        validate_steps(_steps(num_accepted_tokens=5))
    with pytest.raises(TraceError, match="missing columns"):
        validate_steps(_steps().drop(columns=["kv_tokens"]))
    p = tmp_path / "s.jsonl"
    p.write_text(_steps().to_json(orient="records", lines=True))
    assert read_steps(p).loc[0, "batched_tokens"] == 4
    p.write_text("oops\n")
    with pytest.raises(TraceError, match="s.jsonl:1: not JSON"):
        read_steps(p)


def test_jsonl_parsed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    """read_trace keeps a parsed JSON-lines file as parquet keyed by its bytes: the second read comes from the
    cache and equals the first; changed bytes or other arguments are a new entry; a broken entry is re-parsed."""
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    recs = [{"id": str(i), "prompt_token_ids": [1, 2, 3], "generated_token_ids": [5] * 6,
             "acc_ngram": {"acc_len": [1, 2, 1, 3, 1, 1]}, "acc_eagle": {"acc_len": [2, 2, 1, 1, 4, 1]}}
            for i in range(3)]
    src = _write_jsonl(tmp_path / "combined_x.jsonl", recs)
    first = read_trace(src)
    entries = sorted((tmp_path / "cache" / "traces").glob("*.parquet"))
    assert len(entries) == 1
    second = read_trace(src)
    pd.testing.assert_frame_equal(first.acc, second.acc)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    assert second.meta == first.meta
    assert sorted((tmp_path / "cache" / "traces").glob("*.parquet")) == entries  # a hit writes nothing new
    read_trace(src, dataset="other")                                              # other arguments: a new key
    assert len(list((tmp_path / "cache" / "traces").glob("*.parquet"))) == 2
    recs[0]["acc_ngram"]["acc_len"][1] = 3                                       # other bytes: a new key
    _write_jsonl(src, recs)
    changed = read_trace(src)
    assert changed.acc.loc[(changed.acc.request_id == "0") & (changed.acc.proposer == "ngram"),
                           "acc_len"].tolist()[:2] == [1, 3]
    entries[0].write_bytes(b"not parquet")                                        # a broken entry: parsed again
    _write_jsonl(src, [dict(r, acc_ngram={"acc_len": [1, 2, 1, 3, 1, 1]}) for r in recs])
    again = read_trace(src)
    pd.testing.assert_frame_equal(again.acc, first.acc)
    monkeypatch.setenv("SPEC_REPRO_TRACE_CACHE", "0")
    n = len(list((tmp_path / "cache" / "traces").glob("*.parquet")))
    read_trace(src, dataset="third")
    assert len(list((tmp_path / "cache" / "traces").glob("*.parquet"))) == n     # off: nothing written


def test_id_lists_read_from_offsets_match_element_by_element():
    """The parquet reader's id lists come from the list column's offsets and flat values: the same lists
    (and Python ints) as pyarrow's element-by-element ``to_pylist``, sliced, chunked or with a null inside a
    list."""
    import pyarrow as pa

    from spec_repro.traces import _id_lists

    base = pa.array([None, [9], None, [1, 2, 3], None, [], None, [7, 8]], type=pa.list_(pa.int32()))
    for arr in (base, base.slice(2, 6), pa.chunked_array([base.slice(2, 3), base.slice(5, 3)]),
                pa.array([[1, None], None, [2**40]], type=pa.list_(pa.int64())),
                pa.chunked_array([], type=pa.list_(pa.int32()))):
        vals = arr.to_pylist()
        rows, lists = _id_lists(arr)
        assert rows.tolist() == [i for i, v in enumerate(vals) if v is not None]
        assert lists == [v for v in vals if v is not None]
        assert all(type(x) is int for v in lists for x in v if x is not None)


def test_concat_checks_rows_twice_only_where_parts_share_a_request():
    """Parts with no request in common cannot repeat a row (each is a checked trace); a shared request is
    still found and named."""
    def mk(rid, ds="d"):
        return Trace.from_arrays({rid: {"ngram": [1, 2, 1]}}, prompt_lens={rid: 5}, dataset=ds, model="m")

    assert len(Trace.concat([mk("r0"), mk("r1")]).requests) == 2
    assert len(Trace.concat([mk("r0"), mk("r0", ds="e")]).requests) == 2
    with pytest.raises(TraceError, match="duplicate rows after concat, e.g. request 'r0' of 'd'"):
        Trace.concat([mk("r0"), mk("r1"), mk("r0")])


def test_loop_share_marks_the_tokens_of_repeated_spans():
    from spec_repro.metrics import loop_share

    fresh = list(range(100))
    assert loop_share(fresh) == 0.0 and np.isnan(loop_share([])) and loop_share([7] * 32) == 0.0
    # 40 fresh tokens, then a 5-token cycle for 60 tokens: every span of 32 starting at the cycle's 6th token
    # occurred 5 tokens earlier, so the cycle's tokens from its 6th on are inside the loop (55 of 100)
    cyc = list(range(40)) + [1000 + i % 5 for i in range(60)]
    assert loop_share(cyc) == pytest.approx(55 / 100)
    # a 32-token block said twice: the second copy (32 of 96 tokens) is the loop; window 33 finds none
    block = list(range(200, 232))
    twice = block + list(range(300, 332)) + block
    assert loop_share(twice) == pytest.approx(32 / 96) and loop_share(twice, window=33) == 0.0
    assert loop_share(np.array(twice, np.int32)) == loop_share(twice)


def test_request_outputs_and_the_short_output_split():
    from spec_repro.metrics import request_outputs, split_by_output_len

    looped = list(range(10)) + [5, 6] * 45           # 100 tokens, mostly a 2-token cycle
    outs = {"a": list(range(40)), "b": list(range(8)), "c": looped}
    t = Trace.from_arrays({rid: {"ngram": [1] * len(o), "eagle": [2] * len(o)} for rid, o in outs.items()},
                          prompt_lens={"a": 3, "b": 3, "c": 3}, dataset="sharegpt", model="m",
                          request_info={rid: {"output_token_ids": o} for rid, o in outs.items()})
    ro = request_outputs(t).set_index("request_id")
    assert ro["output_len"].to_dict() == {"a": 40, "b": 8, "c": 100}
    assert ro["short"].to_dict() == {"a": False, "b": True, "c": False}
    assert ro.loc["a", "loop_share"] == 0.0 and ro.loc["c", "loop_share"] == pytest.approx(0.88)
    assert ro["looping"].to_dict() == {"a": False, "b": False, "c": True}
    long, short = split_by_output_len(t)
    assert sorted(long.requests["request_id"]) == ["a", "c"] and list(short.requests["request_id"]) == ["b"]
    assert len(long.acc) == 2 * 140 and len(short.acc) == 2 * 8 and set(short.acc["request_id"]) == {"b"}
    assert len(split_by_output_len(t, min_len=41)[0].requests) == 1
    bare = Trace(t.acc, t.requests.drop(columns=["output_token_ids"]), {})
    assert request_outputs(bare)["loop_share"].isna().all()


def test_committed_sharegpt_trace_is_drawn_by_conversation():
    """The committed Qwen ShareGPT trace: the workload's 400-request draw by conversation, decoded by vLLM, its
    outputs under 32 tokens left out and reported apart in the manifest; every later turn comes with its history
    (the study's ShareGPT prompts are first turns or later turns with their history); loops computed from the
    stored output ids."""
    import json
    from pathlib import Path

    from spec_repro.metrics import MIN_OUTPUT_LEN, request_outputs

    p = Path(__file__).resolve().parents[1] / "data" / "traces" / "qwen2.5-coder-1.5b__sharegpt.parquet"
    t = Trace.from_parquet(p)
    ro = request_outputs(t)
    assert len(ro) == 347 >= 300 and int(ro["short"].sum()) == 0 and int(ro["looping"].sum()) == 37
    assert not ro["loop_share"].isna().any()
    req = t.requests.set_index("request_id")
    later = [r for r in req.index if not r.endswith("_0")]
    assert len(later) == 162 and all(r.endswith("#h") for r in later)
    turns = req["prompt_text"].map(lambda s: s.count("<|im_start|>user"))
    assert (turns[later] >= 2).all() and (turns.drop(later) == 1).all()      # history: earlier user turns
    assert (req.loc[later, "prompt_text"].map(lambda s: s.count("<|im_start|>assistant")) >= 2).all()
    short = json.loads((p.parent / "MANIFEST.json").read_text())[p.name]["short_outputs"]
    assert len(short["ids"]) == 53 and max(short["output_len"]) < MIN_OUTPUT_LEN == short["min_output_len"]
    assert not set(short["ids"]) & set(req.index) and len(req) + len(short["ids"]) == 400
