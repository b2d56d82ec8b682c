"""Bad inputs and faults at the command line: every case ends in ONE clear line and a non-zero exit, or
in the correct result; never a traceback, a silently wrong number or a lost row.

The matrix runs ``spec_repro.cli.main`` in-process (fast); a few cases run the real console command in a
subprocess (tracebacks, locks, kills). Collection kill-and-resume cases use the embedded SmolLM2 (``slow``)."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro.cli import main

ROOT = Path(__file__).resolve().parents[1]
PRESET = json.loads((ROOT / "spec_repro" / "presets" / "llama3.1-8b-h100.json").read_text())
FIX = ROOT / "tests" / "fixtures" / "published"


# ---- helpers ----------------------------------------------------------------------------------------------
def run(args) -> tuple[int, str]:
    """(exit code, the one error line) of ``spec-repro ARGS`` in-process. Any exception other than SystemExit
    propagates and fails the test: that is a traceback for a user."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        if isinstance(e.code, str):
            return 1, e.code
        return int(e.code or 0), ""
    return code, ""


def good_records(n=3, L=20, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        recs.append({"id": str(i), "prompt_token_ids": list(range(1, 30)),
                     "generated_token_ids": list(range(100, 100 + L)),
                     "acc_ngram": {"acc_len": rng.integers(1, 6, L).tolist()},
                     "acc_eagle": {"acc_len": rng.integers(1, 5, L).tolist()}})
    return recs


def write_jsonl(path: Path, recs) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def cost_model(tmp: Path, mutate=None, raw: str | None = None) -> Path:
    p = tmp / "cm.json"
    if raw is not None:
        p.write_text(raw)
        return p
    d = json.loads(json.dumps(PRESET))
    if mutate:
        mutate(d)
    p.write_text(json.dumps(d))
    return p


def sim(trace, *extra, out=None, tmp=None, proposers="ngram", policy=("oracle",)):
    out = out if out is not None else tmp / "out.csv"
    return ["simulate", "--traces", *([trace] if not isinstance(trace, list) else trace), "--proposers", proposers,
            "--policy", *policy, "--out", out, "--no-progress", *extra]


def parquet_trace(tmp: Path, mutate_acc=None, meta_requests: bytes | None = None) -> Path:
    """A parquet trace from the good records, its acceptance table optionally altered (written with pyarrow,
    bypassing the package's writer, as a hostile or foreign file would be)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spec_repro.tracefiles import read_trace

    src = write_jsonl(tmp / "src.jsonl", good_records())
    t = read_trace(src)
    acc = t.acc.copy()
    if mutate_acc:
        acc = mutate_acc(acc)
    table = pa.Table.from_pandas(acc, preserve_index=False)
    md = dict(table.schema.metadata or {})
    md[b"spec_repro.requests"] = meta_requests if meta_requests is not None else \
        t.requests.to_json(orient="records").encode()
    md[b"spec_repro.meta"] = b"{}"
    p = tmp / "t.parquet"
    pq.write_table(table.replace_schema_metadata(md), p)
    return p


def _set(path, value):
    def f(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return f


def _rec(**change):
    r = good_records(1)[0]
    r.update(change)
    return r


# ---- the matrix: (id, build(tmp) -> args, expected error regex | None for success, check(tmp) | None) ------------
def _trace_case(recs, name="x.jsonl"):
    return lambda tmp: sim(write_jsonl(tmp / name, recs), tmp=tmp)


def _cm_case(mutate=None, raw=None, proposers="ngram", policy=("oracle",)):
    def build(tmp):
        tr = write_jsonl(tmp / "x.jsonl", good_records())
        return sim(tr, "--cost-model", cost_model(tmp, mutate, raw), tmp=tmp, proposers=proposers, policy=policy)
    return build


def _opt_case(*extra, proposers="ngram", policy=("oracle",)):
    def build(tmp):
        tr = write_jsonl(tmp / "x.jsonl", good_records())
        return sim(tr, *extra, tmp=tmp, proposers=proposers, policy=policy)
    return build


def _pq_case(mutate_acc=None, meta_requests=None, corrupt=None):
    def build(tmp):
        p = parquet_trace(tmp, mutate_acc, meta_requests)
        if corrupt:
            corrupt(p)
        return sim(p, tmp=tmp)
    return build


def _acc_set(col, i, v, dtype=None):
    def f(acc):
        if dtype:
            acc[col] = acc[col].astype(dtype)
        acc.loc[i, col] = v
        return acc
    return f


def _cut_half(p: Path):
    b = p.read_bytes()
    p.write_bytes(b[: len(b) // 2])


deep = "[" * 100000 + "]" * 100000

TRACES = [
    ("trace-missing", lambda tmp: sim(tmp / "nope.jsonl", tmp=tmp), r"no such trace file"),
    ("trace-is-dir", lambda tmp: sim((tmp / "d.jsonl").mkdir() or tmp / "d.jsonl", tmp=tmp), r"not a regular file"),
    ("trace-empty", _trace_case([]), r"empty trace file"),
    ("trace-not-json", _trace_case(["{not json"]), r"not JSON"),
    ("trace-json-array-line", _trace_case(["[1, 2, 3]"]), r"expected a JSON object"),
    ("trace-binary", lambda tmp: sim((tmp / "b.jsonl").write_bytes(bytes(range(256)) * 8) and tmp / "b.jsonl",
                                     tmp=tmp), r"not UTF-8|not JSON"),
    ("trace-deeply-nested", _trace_case([deep]), r"nested too deeply|not JSON"),
    ("trace-no-acc-key", _trace_case([{"id": "0", "prompt_token_ids": [1]}]), r"no acceptance key"),
    ("trace-acc-strings", _trace_case([_rec(acc_ngram={"acc_len": ["a", "b"]})]), r"only ints"),
    ("trace-acc-zero", _trace_case([_rec(acc_ngram={"acc_len": [1, 0, 2]})]), r"< 1"),
    ("trace-acc-negative", _trace_case([_rec(acc_ngram={"acc_len": [-3, 2]})]), r"< 1"),
    ("trace-acc-fraction", _trace_case([_rec(acc_ngram={"acc_len": [1.5, 2]})]), r"finite ints"),
    ("trace-acc-nan", _trace_case(['{"id": "0", "prompt_token_ids": [1], "acc_ngram": {"acc_len": [1, NaN]}}']),
     r"finite ints"),
    ("trace-acc-inf", _trace_case(['{"id": "0", "prompt_token_ids": [1], "acc_ngram": {"acc_len": [Infinity]}}']),
     r"finite ints"),
    ("trace-acc-overflow-70000", _trace_case([_rec(acc_ngram={"acc_len": [1, 70000, 2]})]), r"exceeds 32767"),
    ("trace-acc-overflow-40000", _trace_case([_rec(acc_ngram={"acc_len": [40000]})]), r"exceeds 32767"),
    ("trace-acc-huge-int", _trace_case([_rec(acc_ngram={"acc_len": [10 ** 30]})]), r"ints|exceeds"),
    ("trace-acc-bool", _trace_case([_rec(acc_ngram={"acc_len": [True, 2]})]), r"only ints"),
    ("trace-acc-bad-string", _trace_case([_rec(acc_ngram={"acc_len": "[1, 2"})]), r"not a JSON list"),
    ("trace-acc-object-no-list", _trace_case([_rec(acc_ngram={"lens": [1]})]), r"no 'acc_len'"),
    ("trace-duplicate-id", _trace_case(good_records(2)[:1] * 2), r"duplicate request id"),
    ("trace-prompt-missing", _trace_case([{"id": "0", "acc_ngram": {"acc_len": [1]}}]), r"prompt_token_ids"),
    ("trace-all-empty", _trace_case([_rec(acc_ngram={"acc_len": []}, acc_eagle={"acc_len": []})]),
     r"no request with a non-empty"),
    ("trace-unknown-extension", lambda tmp: sim((tmp / "t.txt").write_text("x") and tmp / "t.txt", tmp=tmp),
     r"unknown trace format"),
    ("parquet-garbage", lambda tmp: sim((tmp / "g.parquet").write_bytes(b"PAR1garbage") and tmp / "g.parquet",
                                        tmp=tmp), r"not a readable parquet"),
    ("parquet-cut", _pq_case(corrupt=_cut_half), r"not a readable parquet"),
    ("parquet-missing-columns", _pq_case(lambda a: a.drop(columns=["acc_len"])), r"missing columns"),
    ("parquet-acc-overflow", _pq_case(_acc_set("acc_len", 3, 70000, "int64")), r"outside|exceeds"),
    ("parquet-acc-fraction", _pq_case(_acc_set("acc_len", 3, 1.5, "float64")), r"non-integral"),
    ("parquet-acc-nan", _pq_case(_acc_set("acc_len", 3, np.nan, "float64")), r"non-finite"),
    ("parquet-position-gap", _pq_case(_acc_set("position", 5, 999, "int64")), r"positions|length mismatch"),
    ("parquet-bad-metadata", _pq_case(meta_requests=b"{not json"), r"unreadable spec_repro metadata"),
    ("parquet-request-table-missing", _pq_case(meta_requests=b"[]"), r"missing columns|no entry"),
]

COST_MODELS = [
    ("cm-negative-c_kv", _cm_case(_set(["target", "c_kv"], -1e-8)), r"negative"),
    ("cm-negative-overhead", _cm_case(_set(["overhead"], -0.001)), r"negative"),
    ("cm-zero-forward", _cm_case(lambda d: d["target"].update(c_tok=0.0, c0=0.0)), r"must be > 0"),
    ("cm-nan", _cm_case(raw=json.dumps(PRESET).replace('"c0": 0.00588590713', '"c0": NaN')), r"finite"),
    ("cm-inf-overhead", _cm_case(raw=json.dumps(PRESET).replace('"overhead": 0.00120683946',
                                                                 '"overhead": Infinity')), r"finite"),
    ("cm-string-coefficient", _cm_case(_set(["target", "c_tok"], "fast")), r"malformed value"),
    ("cm-missing-target", _cm_case(lambda d: d.pop("target")), r"missing key 'target'"),
    ("cm-not-json", _cm_case(raw="{oops"), r"not JSON"),
    ("cm-json-array", _cm_case(raw="[1, 2]"), r"expected a JSON object"),
    ("cm-binary", _cm_case(raw="\udcff"[:0] + "\x00\xff"), r"not JSON"),
    ("cm-unknown-drafter-kind", _cm_case(_set(["drafters", "ngram"], {"kind": "magic"})), r"has kind"),
    ("cm-drafter-not-object", _cm_case(_set(["drafters", "ngram"], [1, 2])), r"has kind"),
    ("cm-negative-fraction", _cm_case(_set(["drafters", "ngram", "fraction"], -0.5)), r"negative"),
    ("cm-negative-eagle-c0", _cm_case(_set(["drafters", "eagle", "c0"], -1.0), proposers="eagle"), r"negative"),
    ("cm-lacks-drafter", _cm_case(lambda d: d["drafters"].pop("eagle"), proposers="eagle"),
     r"no drafting model for proposer 'eagle'"),
    ("cm-lacks-ngram-for-combine", _cm_case(lambda d: d["drafters"].pop("ngram"), proposers="ngram,eagle",
                                            policy=("oracle-combine",)), r"no drafting model for proposer 'ngram'"),
    ("cm-unknown-name", _opt_case("--cost-model", "no-such-preset"), r"unknown cost model"),
    ("cm-is-dir", lambda tmp: _opt_case("--cost-model", tmp)(tmp), r"unknown cost model"),
]

OPTIONS = [
    ("bs-zero", _opt_case("--batch-sizes", "0"), r"batch sizes must be >= 1"),
    ("bs-negative", _opt_case("--batch-sizes", "1", "-4"), r"batch sizes must be >= 1"),
    ("bs-absurd", _opt_case("--batch-sizes", str(10 ** 12)), r"<= 1,000,000"),
    ("policy-fixed-0", _opt_case(policy=("fixed-0",)), r"K must be >= 1"),
    ("policy-fixed-huge", _opt_case("--ngram-match-prob", "0.5", policy=("fixed-99999999999999999999",)),
     r"K must be <="),
    ("policy-unknown", _opt_case(policy=("greedy",)), r"unknown policy"),
    ("policy-fixed-beyond-k-max", _opt_case("--ngram-match-prob", "0.5", policy=("fixed-3", "fixed-9")),
     r"measured acceptance only up to k_max = 4"),
    ("policy-several-proposers", _opt_case(proposers="ngram,eagle", policy=("oracle",)), r"takes one proposer"),
    ("draft-cost-unknown", _opt_case("--draft-cost", "free", proposers="ngram,eagle",
                                     policy=("oracle-combine",)), r"unknown draft_cost"),
    ("batching-unknown", _opt_case("--batching", "static"), r"unknown batching"),
    ("combine-ngram-only-without-ngram", _opt_case(proposers="eagle", policy=("oracle-combine",)),
     r"include no n-gram proposer"),
    ("sample-zero", _opt_case("--sample", "0"), r"sample=0"),
    ("sample-too-many", _opt_case("--sample", "99"), r"sample=99"),
    ("seed-negative", _opt_case("--seed", "-1"), r"seed must be an integer >= 0"),
    ("match-prob-above-1", _opt_case("--ngram-match-prob", "1.5", policy=("fixed-3",)), r"must lie in \[0, 1\]"),
    ("match-prob-nan", _opt_case("--ngram-match-prob", "nan", policy=("fixed-3",)), r"must lie in \[0, 1\]"),
    ("proposer-twice", _opt_case(proposers="ngram,ngram", policy=("oracle-combine",)), r"listed twice"),
    ("proposer-unknown", _opt_case(proposers="medusa"), r"unknown proposer"),
]

PATHS = [
    ("out-is-dir", lambda tmp: sim(write_jsonl(tmp / "x.jsonl", good_records()), out=tmp, tmp=tmp),
     r"is a directory"),
    ("out-parent-is-file", lambda tmp: sim(write_jsonl(tmp / "x.jsonl", good_records()),
                                           out=(tmp / "f").write_text("x") and tmp / "f" / "o.csv", tmp=tmp),
     r"is a file, not a folder"),
    ("out-empty-name", lambda tmp: sim(write_jsonl(tmp / "x.jsonl", good_records()), out="", tmp=tmp),
     r"not a file name"),
    ("collect-out-is-file", lambda tmp: ["collect", "--workloads", "code-edit", "--out",
                                         (tmp / "f").write_text("x") and tmp / "f"], r"is a file, not a folder"),
]

COLLECT_ARGS = [
    ("collect-n-zero", ["-n", "0"], r"-n must be"),
    ("collect-k-max-zero", ["--k-max", "0"], r"--k-max must be"),
    ("collect-k-max-overflow", ["--k-max", "40000"], r"--k-max must be"),
    ("collect-batch-zero", ["--batch-size", "0"], r"--batch-size must be"),
    ("collect-max-new-zero", ["--max-new-tokens", "0"], r"--max-new-tokens must be"),
    ("collect-max-n-below-min-n", ["--min-n", "5", "--max-n", "2"], r"--max-n must be"),
    ("collect-prompt-tokens-zero", ["--max-prompt-tokens", "0"], r"--max-prompt-tokens must be"),
    ("collect-threads-zero", ["--threads", "0"], r"--threads must be >= 1"),
    ("collect-min-output-len-negative", ["--min-output-len", "-1"], r"--min-output-len must be"),
    ("collect-min-output-len-above-max-new", ["--max-new-tokens", "8", "--min-output-len", "9"],
     r"--min-output-len must be an integer in 0..8"),
    ("collect-unknown-workload", ["--workloads", "nope"], r"unknown workload"),
]

OTHER_COMMANDS = [
    ("reproduce-missing-trace", lambda tmp: ["reproduce", "--traces", tmp / "m.jsonl", "--out", tmp / "r"],
     r"no such trace file"),
    ("reproduce-bad-trace", lambda tmp: ["reproduce", "--traces", write_jsonl(tmp / "b.jsonl", ["{oops"]),
                                         "--out", tmp / "r"], r"not JSON"),
    ("reproduce-out-is-file", lambda tmp: ["reproduce", "--out", (tmp / "f").write_text("x") and tmp / "f"],
     r"is a file, not a folder"),
    ("reproduce-unknown-notebook", lambda tmp: ["reproduce", "--only", "99_nope", "--out", tmp / "r"],
     r"no such notebook"),
    ("cpu-verify-cost-out-is-dir", lambda tmp: ["cpu-verify-cost", "--out", tmp], r"is a directory"),
    ("cpu-verify-cost-repeats-0", lambda tmp: ["cpu-verify-cost", "--repeats", "0", "--out", tmp / "v.csv"],
     r"--repeats >= 1"),
    ("vllm-summarize-missing-raw", lambda tmp: ["vllm", "summarize", "--raw", tmp / "nope", "--out", tmp / "s"],
     r"no such folder"),
    ("vllm-summarize-empty-raw", lambda tmp: ["vllm", "summarize", "--raw", tmp, "--out", tmp / "s"],
     r"no device outputs"),
    ("models-unknown", lambda tmp: ["models", "info", "gpt-17"], r"unknown model 'gpt-17'"),
    ("workloads-negative-n", lambda tmp: ["workloads", "show", "code-edit", "-n", "-1"], r"n must be >= 0"),
]

MATRIX = TRACES + COST_MODELS + OPTIONS + PATHS + OTHER_COMMANDS


def _check_error(code, msg, pattern):
    assert code != 0, "exit code 0 for a bad input"
    assert msg.startswith("error: "), msg
    assert "\n" not in msg.strip() and "Traceback" not in msg, msg
    assert __import__("re").search(pattern, msg), msg


@pytest.mark.parametrize("name,build,pattern", MATRIX, ids=[c[0] for c in MATRIX])
def test_matrix(tmp_path, name, build, pattern):
    args = build(tmp_path)
    code, msg = run(args)
    _check_error(code, msg, pattern)
    out = tmp_path / "out.csv"
    assert not out.exists(), "a refused run must not write its output"


@pytest.mark.parametrize("name,extra,pattern", COLLECT_ARGS, ids=[c[0] for c in COLLECT_ARGS])
def test_collect_refuses_before_loading(tmp_path, monkeypatch, name, extra, pattern):
    from spec_repro import models

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("model loaded before validation"))
    args = ["collect", "--workloads", "code-edit", "--out", tmp_path / "o", *extra]
    if "--workloads" in extra:
        args = ["collect", "--out", tmp_path / "o", *extra]
    _check_error(*run(args), pattern)


# ---- correct results (the fault is handled, the numbers are right) ---------------------------------------------
def test_combine_single_proposer_winner_equals_oracle(tmp_path):
    """oracle-combine with one non-n-gram proposer, charged its own drafting (winner / all) = its oracle."""
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    assert run(sim(tr, "--draft-cost", "winner", "all", proposers="eagle", policy=("oracle-combine",),
                   out=tmp_path / "c.csv"))[0] == 0
    assert run(sim(tr, proposers="eagle", policy=("oracle",), out=tmp_path / "o.csv"))[0] == 0
    c, o = pd.read_csv(tmp_path / "c.csv"), pd.read_csv(tmp_path / "o.csv")
    assert np.allclose(c.speedup, o.speedup.iloc[0], rtol=1e-12)


def test_huge_mixed_batch_is_correct_and_cheap(tmp_path):
    """B = 10^6 with continuous batching equals B = n requests (at most n ever run at once)."""
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    assert run(sim(tr, "--batching", "mixed", "--batch-sizes", "3", "1000000", tmp=tmp_path))[0] == 0
    df = pd.read_csv(tmp_path / "out.csv")
    assert df.speedup.iloc[0] == pytest.approx(df.speedup.iloc[1], rel=1e-12) and np.isfinite(df.speedup).all()


def test_speedups_finite_positive_for_a_valid_zero_kv_model(tmp_path):
    """Zero coefficients where they are allowed (c_kv = 0, no overhead) still give finite positive speedups."""
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    cm = cost_model(tmp_path, lambda d: d["target"].update(c_kv=0.0) or d.update(overhead=0.0))
    assert run(sim(tr, "--cost-model", cm, "--batch-sizes", "1", "64", tmp=tmp_path))[0] == 0
    s = pd.read_csv(tmp_path / "out.csv").speedup
    assert (s > 0).all() and np.isfinite(s).all()


def test_full_disk_keeps_the_good_csv(tmp_path, monkeypatch):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    out = tmp_path / "out.csv"
    assert run(sim(tr, tmp=tmp_path))[0] == 0
    good = out.read_bytes()
    real = pd.DataFrame.to_csv

    def full_disk(self, path, *a, **k):
        Path(path).write_text("dataset,mod")  # half a CSV, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    code, msg = run(sim(tr, "--batch-sizes", "1", "8", tmp=tmp_path))
    monkeypatch.setattr(pd.DataFrame, "to_csv", real)
    _check_error(code, msg, r"No space left on device")
    assert out.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []  # no temporary left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    _check_error(*run(sim(tr, out=ro / "o.csv", tmp=tmp_path)), r"not writable")


def test_unreadable_trace_is_one_line(tmp_path, monkeypatch):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    real_open = open

    def denied(path, *a, **k):
        if str(path) == str(tr):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", denied)
    _check_error(*run(sim(tr, tmp=tmp_path)), r"Permission denied")


# ---- provenance from the data ------------------------------------------------------------------------------
def test_jsonl_is_not_labelled_the_study_by_its_name(tmp_path):
    """A file named like the study's (the synthetic fixture) is not labelled Llama-3.1-8B/H100."""
    from spec_repro import analysis

    t = analysis.load_traces(str(FIX / "combined_instructcoder.jsonl"))
    assert t.models == ["unknown"] and "not the study's" in analysis.short_source(t)
    assert "published traces (vLLM, H100)" not in analysis.short_source(t)
    assert run(sim(str(FIX / "combined_cnn.jsonl"), proposers="eagle", tmp=tmp_path))[0] == 0
    assert set(pd.read_csv(tmp_path / "out.csv").model) == {"unknown"}


def test_jsonl_label_from_its_own_records_and_study_by_content(tmp_path, monkeypatch):
    from spec_repro import analysis, traces
    from spec_repro.provenance import sha256_file

    recs = good_records()
    for r in recs:
        r["model"] = "my-model"
    own = write_jsonl(tmp_path / "combined_cnn.jsonl", recs)
    assert analysis.load_traces(str(own)).models == ["my-model"]
    # the study's files are recognized by content wherever they live and whatever their name
    fake = shutil.copy(FIX / "combined_cnn.jsonl", tmp_path / "renamed.jsonl")
    monkeypatch.setitem(traces.STUDY_FILES, sha256_file(fake), ("combined_cnn.jsonl", "cnn", 3))
    t = analysis.load_traces(str(fake))
    assert t.models == [traces.STUDY_MODEL] and "published traces (vLLM, H100)" in analysis.short_source(t)


def test_own_traces_round_trip_their_model_through_json_lines(tmp_path):
    from spec_repro.tracefiles import read_trace

    t = read_trace(write_jsonl(tmp_path / "x.jsonl", good_records()), model="smollm2-135m")
    back = read_trace(t.to_published_jsonl(tmp_path / "y.jsonl"))
    assert back.models == ["smollm2-135m"]


# ---- subprocess: what a user really sees -----------------------------------------------------------------------
def _cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "spec_repro.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", ["negative-cost-model", "overflow-trace", "out-is-dir"])
def test_console_no_traceback(tmp_path, case):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    args = sim(tr, tmp=tmp_path)
    if case == "negative-cost-model":
        args += ["--cost-model", cost_model(tmp_path, _set(["target", "c0"], -1.0))]
    elif case == "overflow-trace":
        args[2] = write_jsonl(tmp_path / "o.jsonl", [_rec(acc_ngram={"acc_len": [70000]})])
    else:
        args[args.index("--out") + 1] = tmp_path
    r = _cli(*args)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- collect: partial files, locks, kills ----------------------------------------------------------------------
# mt-bench, 4 new tokens: the collections below decode mt-bench's short questions (52 to 243 prompt tokens) in half
# the time 8 tokens of code-edit's prompts take; what a kill, a lock or a resume does depends on no prompt and no
# output length (each request is one line of the partial file whatever its length)
MODEL, WL = "smollm2-135m", "mt-bench"


def _settings_header(**over):
    from spec_repro.collect import _resume_settings

    s = _resume_settings(MODEL, WL, n=3, max_new_tokens=4, k_max=16, seed=0, proposers=["early-exit", "ngram"],
                         draft_model=None, early_exit_layers=None, min_n=3, max_n=7, max_prompt_tokens=1024,
                         batch_size=1, device="cpu")
    s.update(over)
    return json.dumps({"spec_repro_partial": 1, "settings": s}) + "\n"


COLLECT = ["collect", "--workloads", WL, "-n", "3", "--max-new-tokens", "4", "--batch-size", "1", "--threads", "1"]


@pytest.mark.parametrize("name,content,pattern", [
    ("other-max-new-tokens", _settings_header(max_new_tokens=16), r"other settings \(max_new_tokens 16 -> 4"),
    ("other-k-max", _settings_header(k_max=4), r"other settings \(k_max 4 -> 16"),
    ("no-settings-header", json.dumps({"request_id": "x"}) + "\n", r"records no settings"),
    ("corrupt-middle-line", _settings_header() + "{cut\n" + json.dumps({"request_id": "x"}) + "\n",
     r"line 2 is corrupt"),
])
def test_partial_file_refused_before_loading(tmp_path, monkeypatch, name, content, pattern):
    from spec_repro import collect as C, models

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("model loaded before the partial file check"))
    part = C.partial_path(tmp_path, MODEL, WL)
    part.parent.mkdir(parents=True)
    part.write_text(content)
    code, msg = run(COLLECT + ["--out", tmp_path])
    _check_error(code, msg, pattern)
    assert str(part) in msg and "--force" in msg
    assert part.read_text() == content  # a refused resume leaves the file alone


def test_second_collect_on_same_out_refuses(tmp_path, monkeypatch):
    from spec_repro import collect as C, models

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("model loaded while the lock is held"))
    lock = C.partial_path(tmp_path, MODEL, WL).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               "l = FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); time.sleep(60)",
                               str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _check_error(*run(COLLECT + ["--out", tmp_path]), r"another process is writing")
    finally:
        holder.kill()
        holder.wait()


def test_partial_reader_drops_a_cut_last_line(tmp_path):
    from spec_repro.collect import _read_partial
    from spec_repro.profiler import RequestProfile

    part = tmp_path / "p.jsonl"
    good = json.dumps(RequestProfile("a", WL, [1], [2]).to_json()) + "\n"
    part.write_text(_settings_header() + good + good.replace('"a"', '"b"')[:25])
    done = _read_partial(part, None)
    assert list(done) == ["a"] and part.read_text() == _settings_header() + good  # truncated before appending
    part.write_text(_settings_header() + good.rstrip("\n"))  # complete JSON, newline never written: cut too
    assert _read_partial(part, None) == {} and part.read_text() == _settings_header()


def _trace_frame(path):
    from spec_repro.tracefiles import read_trace

    t = read_trace(path)
    acc = t.acc.sort_values(["request_id", "proposer", "position"]).reset_index(drop=True)
    req = t.requests.sort_values("request_id").reset_index(drop=True)
    return acc, req[["request_id", "prompt_len", "output_len", "prompt_token_ids", "output_token_ids"]]


def _same_trace(a, b):
    (acc_a, req_a), (acc_b, req_b) = _trace_frame(a), _trace_frame(b)
    pd.testing.assert_frame_equal(acc_a, acc_b)
    assert req_a.drop(columns=["prompt_token_ids", "output_token_ids"]).equals(
        req_b.drop(columns=["prompt_token_ids", "output_token_ids"]))
    assert [list(x) for x in req_a.output_token_ids] == [list(x) for x in req_b.output_token_ids]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted tiny collection (3 requests, 4 new tokens, batches of 1)."""
    out = tmp_path_factory.mktemp("ref")
    assert run(COLLECT + ["--out", out])[0] == 0
    return out / f"{MODEL}__{WL}.parquet"


class Killed(BaseException):
    """Stands for SIGKILL in-process: nothing after it runs (not an Exception, so nothing catches it)."""


def _kill_in_append(after_lines: int, cut: int | None):
    """_append that dies once ``after_lines`` profile lines are in the file, optionally leaving ``cut`` bytes
    of the next line (a write cut mid-line)."""
    from spec_repro import collect as C

    real = C._append

    def dying(path, profiles):
        have = len(path.read_text().splitlines()) - 1
        for p in profiles:
            if have >= after_lines:
                if cut is not None:
                    with open(path, "a") as f:
                        f.write(json.dumps(p.to_json())[:cut])
                raise Killed
            real(path, [p])
            have += 1
    return dying


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-header", "after-1-request", "mid-line-2nd-request", "mid-line-3rd-short",
                                   "before-trace-write", "during-trace-write", "before-partial-removed"])
def test_kill_and_resume_gives_the_same_trace(tmp_path, monkeypatch, reference, point):
    from spec_repro import collect as C
    from spec_repro import tracefiles as T

    out = tmp_path / "o"
    final, part = C.trace_path(out, MODEL, WL), C.partial_path(out, MODEL, WL)
    with monkeypatch.context() as m:
        if point == "after-header":
            m.setattr(C, "_append", _kill_in_append(0, None))
        elif point == "after-1-request":
            m.setattr(C, "_append", _kill_in_append(1, None))
        elif point == "mid-line-2nd-request":
            m.setattr(C, "_append", _kill_in_append(1, 100))
        elif point == "mid-line-3rd-short":
            m.setattr(C, "_append", _kill_in_append(2, 3))
        elif point == "before-trace-write":
            m.setattr(C, "profiles_to_trace", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        elif point == "during-trace-write":
            import pyarrow.parquet as pq

            def cut_write(table, where, **k):
                Path(where).write_bytes(b"PAR1 half a file")
                raise Killed
            m.setattr(pq, "write_table", cut_write)
        else:
            m.setattr(C, "record", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            main([str(a) for a in COLLECT + ["--out", out]])
    if point in ("before-trace-write", "during-trace-write"):
        assert not final.exists()
    assert part.exists()
    assert run(COLLECT + ["--out", out])[0] == 0
    assert final.exists() and not part.exists()
    assert json.loads((out / "MANIFEST.json").read_text())[final.name]["n_requests"] == 3
    _same_trace(final, reference)
    assert not [p for p in out.rglob("*.tmp*")]
    assert T.read_trace(final).requests.shape[0] == 3


@pytest.mark.slow
def test_force_clears_a_partial_with_other_settings(tmp_path, reference):
    from spec_repro import collect as C

    part = C.partial_path(tmp_path, MODEL, WL)
    part.parent.mkdir(parents=True)
    part.write_text(_settings_header(max_new_tokens=16) + "{cut")
    _check_error(*run(COLLECT + ["--out", tmp_path]), r"other settings")
    assert run(COLLECT + ["--out", tmp_path, "--force"])[0] == 0
    assert not part.exists()
    _same_trace(C.trace_path(tmp_path, MODEL, WL), reference)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path, reference):
    """A real SIGKILL of the console command while it collects, then a resume: the same trace, no lost rows."""
    from spec_repro import collect as C

    part = C.partial_path(tmp_path, MODEL, WL)
    proc = subprocess.Popen([sys.executable, "-m", "spec_repro.cli", *map(str, COLLECT + ["--out", tmp_path])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if part.exists() and len(part.read_bytes().splitlines()) >= 2:  # header + at least one request
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    r = _cli(*COLLECT, "--out", tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    _same_trace(C.trace_path(tmp_path, MODEL, WL), reference)


# ---- the cache -------------------------------------------------------------------------------------------------
def _private_model_cache(tmp_path, monkeypatch):
    from spec_repro import models

    src = models.model_dir(MODEL)
    models.convert(MODEL, quiet=True)                      # the shared cache, converted and recorded once
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    dst = models.model_dir(MODEL)
    dst.mkdir(parents=True)
    spec = models.spec(MODEL)
    os.symlink(src / spec.gguf_file, dst / spec.gguf_file)    # never written: a link is enough
    shutil.copy2(src / "info.json", dst / "info.json")
    shutil.copytree(src / "hf", dst / "hf", copy_function=shutil.copy2)  # copy2 keeps mtimes: the fast path
    return dst


@pytest.mark.slow
def test_flipped_byte_in_converted_weights_is_caught(tmp_path, monkeypatch):
    from spec_repro import models
    from spec_repro.provenance import sha256_file

    d = _private_model_cache(tmp_path, monkeypatch)
    assert models._converted_ok(MODEL)
    w = d / "hf" / "model.safetensors"
    with open(w, "r+b") as f:
        f.seek(w.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    assert not models._converted_ok(MODEL)
    models.convert(MODEL, quiet=True)           # converted again from the verified GGUF
    rec = json.loads((d / "info.json").read_text())["converted_files"]
    assert sha256_file(w) == rec["model.safetensors"]["sha256"] and models._converted_ok(MODEL)


def test_converted_weights_checked_by_size_mtime_then_hash(tmp_path, monkeypatch):
    """The fast path and the full check, on a fake converted folder (no model needed)."""
    from spec_repro import models
    from spec_repro.provenance import sha256_file

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path))
    hf = models.converted_dir(MODEL)
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"\x00" * 1000)
    models._record_converted(MODEL, {p.name: sha256_file(p) for p in hf.iterdir()})
    assert models._converted_ok(MODEL)
    os.utime(hf / "model.safetensors", (1, 1))                  # touched, same bytes: full check passes
    assert models._converted_ok(MODEL)
    (hf / "model.safetensors").write_bytes(b"\x00" * 999 + b"\x01")  # same size, other bytes
    assert not models._converted_ok(MODEL)
    (hf / "model.safetensors").write_bytes(b"\x00" * 1000)
    (hf / "extra.json").write_text("{}")                            # a file conversion did not write
    assert not models._converted_ok(MODEL)


def _gsm_cache(tmp_path, monkeypatch):
    from spec_repro import models
    from spec_repro.workloads import gsm_symbolic

    src = models.cache_root() / "workloads" / "gsm-symbolic"
    if not (src / "files").exists():
        gsm_symbolic._generators.cache_clear()
        gsm_symbolic._generators()                              # fetch into the shared cache once
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    dst = tmp_path / "cache" / "workloads" / "gsm-symbolic"
    shutil.copytree(src, dst)
    gsm_symbolic._generators.cache_clear()
    return dst


def test_tampered_cached_code_is_never_run(tmp_path, monkeypatch):
    from spec_repro.workloads import gsm_symbolic

    d = _gsm_cache(tmp_path, monkeypatch)
    marker = tmp_path / "pwned"
    gen = d / "files" / "reasoning_gym" / "arithmetic" / "gsm_symbolic" / "generators_00_49.py"
    gen.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + gen.read_text())
    try:
        _check_error(*run(["workloads", "show", "gsm-symbolic", "-n", "1"]), r"does not match the sha256")
        assert not marker.exists()
    finally:
        gsm_symbolic._generators.cache_clear()


def test_missing_cached_code_is_one_line(tmp_path, monkeypatch):
    from spec_repro.workloads import gsm_symbolic

    d = _gsm_cache(tmp_path, monkeypatch)
    (d / "files" / "reasoning_gym" / "utils.py").unlink()
    try:
        _check_error(*run(["workloads", "show", "gsm-symbolic", "-n", "1"]), r"utils.py")
    finally:
        gsm_symbolic._generators.cache_clear()


def test_matrix_size():
    assert len(MATRIX) + len(COLLECT_ARGS) >= 60  # the table alone; the named tests below it add more


def test_out_on_a_pipe_is_written_not_replaced(tmp_path):
    """--out on a named pipe (like /dev/stdout): written in place, never renamed over."""
    import threading

    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    code, msg = run(sim(tr, out=fifo, tmp=tmp_path))
    reader.join(60)
    if reader.is_alive():  # nothing opened the pipe for writing: unblock the reader without ever blocking here
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert code == 0, msg
    assert fifo.is_fifo() and got and got[0].startswith("dataset,model,proposers")


def _record_sha(d: Path) -> None:
    """A workload cache as this version writes it (a shared cache built by an older version records no sha256:
    this version rebuilds such a cache from its wheel rather than serve unverified records)."""
    from spec_repro.fetch import sha256_file

    man = json.loads((d / "manifest.json").read_text())
    man["records_sha256"] = sha256_file(d / "records.jsonl")
    (d / "manifest.json").write_text(json.dumps(man))


def test_cut_workload_cache_is_one_line(tmp_path, monkeypatch):
    from spec_repro import models

    src = models.cache_root() / "workloads" / "code-edit"
    if not (src / "records.jsonl").exists():
        from spec_repro import workloads

        workloads.records("code-edit")
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    dst = tmp_path / "cache" / "workloads" / "code-edit"
    shutil.copytree(src, dst)
    _record_sha(dst)
    b = (dst / "records.jsonl").read_bytes()
    (dst / "records.jsonl").write_bytes(b[: len(b) // 2])  # cut mid-line
    _check_error(*run(["workloads", "show", "code-edit", "-n", "1"]), r"corrupted cache file.*delete")


def test_gguf_changed_on_disk_is_rehashed(tmp_path, monkeypatch):
    """A GGUF whose size/mtime differ from the record is hashed in full (and a flipped byte fails)."""
    from spec_repro import models
    from spec_repro.provenance import sha256_file

    f = tmp_path / "m.gguf"
    f.write_bytes(b"\x01" * 4096)
    want = sha256_file(f)
    rec = tmp_path / "info.json"
    st = f.stat()
    rec.write_text(json.dumps({"gguf_sha256": want, "gguf_size": st.st_size, "gguf_mtime": st.st_mtime}))
    assert models._verified(f, want, rec)
    with open(f, "r+b") as h:
        h.seek(100)
        h.write(b"\x02")
    os.utime(f, (st.st_atime, st.st_mtime + 5))
    assert not models._verified(f, want, rec)


@pytest.mark.slow
def test_two_real_collects_on_one_output(tmp_path, reference):
    """Two console runs started together on the same --out: one writes the trace, the other refuses with one
    line (the lock is taken before the model loads and held to the end, so their start-up skew cannot matter)."""
    from spec_repro import collect as C

    procs = [subprocess.Popen([sys.executable, "-m", "spec_repro.cli", *map(str, COLLECT + ["--out", tmp_path])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes[0] == 0 and codes[1] != 0, errs
    refused = errs[[p.returncode for p in procs].index(codes[1])]
    assert "another process is writing" in refused and "Traceback" not in refused, refused
    assert len(refused.strip().splitlines()) == 1, refused
    _same_trace(C.trace_path(tmp_path, MODEL, WL), reference)


@pytest.mark.slow
def test_kill_mid_batch_redecodes_the_whole_batch(tmp_path, monkeypatch):
    """Batches of 2: a kill after the first request of a batch was saved. The resume decodes that batch again
    whole (each request beside the same neighbour, as in an uninterrupted run) and saves only the missing one."""
    from spec_repro import collect as C

    args = [a if a != "1" or i != COLLECT.index("--batch-size") + 1 else "2" for i, a in enumerate(COLLECT)]
    ref_out = tmp_path / "ref"
    seen = []
    real = C.profile_requests

    def recording(target, todo, *a, **k):
        seen.append([str(r.id) for r in todo])
        yield from real(target, todo, *a, **k)

    monkeypatch.setattr(C, "profile_requests", recording)
    assert run(args + ["--out", ref_out])[0] == 0
    uninterrupted, seen[:] = list(seen), []
    out = tmp_path / "o"
    with monkeypatch.context() as m:
        m.setattr(C, "_append", _kill_in_append(1, 40))
        with pytest.raises(Killed):
            main([str(a) for a in args + ["--out", out]])
    seen[:] = []
    assert run(args + ["--out", out])[0] == 0
    assert seen == uninterrupted  # the cut batch again whole, then the rest
    _same_trace(C.trace_path(out, MODEL, WL), C.trace_path(ref_out, MODEL, WL))
