"""Never destroy a user's files, never trust an unverified byte, validate every number. Each case as a
test: a clear one-line error (or the correct result), nothing lost, nothing cut left behind.

Fast: tiny fixtures, in-process CLI; the real model is never loaded (``models.load`` is made to fail, so a
validation that came after loading would fail the test)."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from test_bad_input import PRESET, _check_error, cost_model, good_records, parquet_trace, run, sim, write_jsonl

MODEL, WL = "smollm2-135m", "code-edit"


@pytest.fixture
def no_model(monkeypatch):
    from spec_repro import models

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("model loaded before the input was checked"))


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ---- data loss ---------------------------------------------------------------------------------------------------
TRAIN = ["train", "eagle", "--workloads", WL]


def test_train_out_dot_deletes_nothing(tmp_path, monkeypatch, no_model):
    (tmp_path / "thesis.tex").write_text("years of work")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.csv").write_text("1,2")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    _check_error(*run(TRAIN + ["--out", "."]), r"current folder")
    _check_error(*run(TRAIN + ["--out", str(tmp_path.parent)]), r"current folder, a folder above it")
    assert _snapshot(tmp_path) == before


def test_train_out_folder_with_other_files_is_refused(tmp_path, no_model):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    _check_error(*run(TRAIN + ["--out", d]), r"holding other files.*nothing was touched")
    assert _snapshot(d) == {"notes.txt": b"keep me"}


def test_train_out_a_file_is_refused_early(tmp_path, no_model):
    f = tmp_path / "f"
    f.write_text("x")
    _check_error(*run(TRAIN + ["--out", f]), r"is a file, not a folder")
    assert f.read_text() == "x"


def test_save_head_never_empties_a_folder(tmp_path):
    """save_head (the library call) writes into a new, empty or owned folder and keeps others' files."""
    import torch

    from _tiny import tiny_llama
    from spec_repro.guard import OWNER_MARKER
    from spec_repro.io import OutputError
    from spec_repro.proposers.eagle import load_head, new_head, save_head

    target = tiny_llama()
    head = new_head(target, "eagle", seed=0)
    d = tmp_path / "other"
    d.mkdir()
    (d / "keep.txt").write_text("k")
    with pytest.raises(OutputError, match="holding other files"):
        save_head(head, d)
    assert _snapshot(d) == {"keep.txt": b"k"}
    empty = tmp_path / "empty"
    empty.mkdir()
    save_head(head, empty, dtype=torch.float64)
    assert (empty / OWNER_MARKER).is_file() and (empty / "model.safetensors").is_file()
    (empty / "README.md").write_text("my notes")          # a user's file in an owned folder survives a rewrite
    save_head(head, empty, dtype=torch.float64)
    assert (empty / "README.md").read_text() == "my notes"
    assert load_head(empty, target) is not None


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "symlink", "hardlink"])
def test_simulate_out_equal_to_its_input_is_refused(tmp_path, kind):
    if kind == "parquet":
        tr = parquet_trace(tmp_path)
    else:
        tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    before = tr.read_bytes()
    out = tr
    if kind == "symlink":
        out = tmp_path / "link.csv"
        out.symlink_to(tr)
    elif kind == "hardlink":
        out = tmp_path / "hard.csv"
        os.link(tr, out)
    _check_error(*run(sim(tr, out=out, tmp=tmp_path)), r"is also an input")
    assert tr.read_bytes() == before


def test_simulate_out_equal_to_its_cost_model_is_refused(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    cm = cost_model(tmp_path)
    before = cm.read_bytes()
    _check_error(*run(sim(tr, "--cost-model", cm, out=cm, tmp=tmp_path)), r"is also an input")
    assert cm.read_bytes() == before


def test_reproduce_with_parameters_or_traces_leaves_the_committed_results(tmp_path, monkeypatch):
    """-p / --traces without --figures: figures, SUMMARY.md, summary.csv and the README table stay as committed;
    everything goes under --out (the notebooks' execution is replaced by a stub recording where they would write)."""
    import papermill as pm

    from spec_repro import reproduce as R

    root = Path(R.__file__).resolve().parents[1]
    committed = {p: p.read_bytes() for p in [root / "README.md", *sorted((root / "figures").glob("*.*"))]}
    seen = []

    def fake_execute(src, dst, parameters=None, **kw):
        seen.append(parameters["figures_dir"])
        raise RuntimeError("not run in this test")

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    monkeypatch.setattr(R, "update_readme_results", lambda *a, **k: pytest.fail("README rewritten"))
    tr = write_jsonl(tmp_path / "combined_x.jsonl", good_records())
    for extra in (["-p", "live_requests=5"], ["--traces", str(tr)]):
        out = tmp_path / f"out{len(seen)}"
        code, _ = run(["reproduce", "--only", "05_oracle_bound", "--out", out, *extra])
        assert code == 1                                       # the stub fails the notebook
        assert seen[-1] == str((out / "figures").resolve())
        assert (out / "figures" / "SUMMARY.md").exists()
    assert {p: p.read_bytes() for p in committed} == committed


# ---- code execution ------------------------------------------------------------------------------------------------
class _Planted:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PWNED']}",))


def test_planted_pickle_checkpoint_is_never_run(tmp_path, monkeypatch):
    from spec_repro.train import _load_checkpoint

    marker = tmp_path / "pwned"
    monkeypatch.setenv("PWNED", str(marker))
    ck = tmp_path / "head" / ".ckpt" / "state.pt"
    ck.parent.mkdir(parents=True)
    ck.write_bytes(pickle.dumps({"settings": _Planted()}))
    with pytest.raises(ValueError, match="not a plain-tensor training checkpoint.*delete"):
        _load_checkpoint(ck, "cpu")
    assert not marker.exists()


def test_plain_checkpoint_loads_weights_only(tmp_path):
    import torch

    from spec_repro.train import _load_checkpoint

    rng = np.random.default_rng(3)
    ck = tmp_path / "state.pt"
    st = {"settings": {"lr": 1e-3}, "head": {"w": torch.ones(2)}, "opt": {}, "sched": {"last_epoch": 4},
          "step": 4, "curve": [[1, 0.5, [0.5]]], "evals": [], "queue": [[1, 2]], "rng": rng.bit_generator.state}
    torch.save(st, ck)
    got = _load_checkpoint(ck, "cpu")
    assert got["rng"] == st["rng"] and got["step"] == 4 and torch.equal(got["head"]["w"], torch.ones(2))


def test_pickled_eagle_bin_is_refused_not_run(tmp_path, monkeypatch):
    from spec_repro.proposers.eagle import EagleError
    from spec_repro.proposers.eagle_files import _read_weights

    marker = tmp_path / "pwned"
    monkeypatch.setenv("PWNED", str(marker))
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": _Planted()}))
    with pytest.raises(EagleError, match="plain tensors"):
        _read_weights(tmp_path)
    assert not marker.exists()


# ---- unverified bytes ----------------------------------------------------------------------------------------------
def _fake_converted(tmp_path, monkeypatch):
    from spec_repro import models
    from spec_repro.fetch import sha256_file

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    hf = models.converted_dir(MODEL)
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    models._record_converted(MODEL, {p.name: sha256_file(p) for p in hf.iterdir()})
    return hf


def _flip_keep_mtime(f: Path, at: int | None = None):
    st = f.stat()
    with open(f, "r+b") as h:
        h.seek(st.st_size // 2 if at is None else at)
        b = h.read(1)
        h.seek(-1, 1)
        h.write(bytes([b[0] ^ 0xFF]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))       # as cp -p, a backup restore or bit rot leave it


def test_flipped_byte_with_mtime_kept_is_caught(tmp_path, monkeypatch):
    from spec_repro import models

    hf = _fake_converted(tmp_path, monkeypatch)
    assert models._converted_ok(MODEL) and models.cache_state(MODEL) == "converted"
    _flip_keep_mtime(hf / "model.safetensors")
    assert not models._converted_ok(MODEL)
    assert models.cache_state(MODEL) == "damaged"             # `models list` no longer says "converted"
    code, _ = run(["models", "list"])
    assert code == 0


def test_gguf_flipped_byte_with_mtime_kept_is_caught(tmp_path):
    from spec_repro import models
    from spec_repro.fetch import sha256_file

    f = tmp_path / "m.gguf"
    f.write_bytes(b"\x01" * 4096)
    want = sha256_file(f)
    st = f.stat()
    rec = tmp_path / "info.json"
    rec.write_text(json.dumps({"gguf_sha256": want, "gguf_size": st.st_size, "gguf_mtime": st.st_mtime}))
    assert models._verified(f, want, rec)
    _flip_keep_mtime(f)
    assert not models._verified(f, want, rec)                 # so it is fetched again, never converted


@pytest.mark.parametrize("raw", ["[]", "null", '"a string"', "{cut"])
def test_info_json_not_an_object(tmp_path, monkeypatch, raw):
    from spec_repro import models

    hf = _fake_converted(tmp_path, monkeypatch)
    (hf.parent / "info.json").write_text(raw)
    assert models.cache_state(MODEL) == "damaged"
    assert models.info(MODEL)["converted_sha256"] is None
    assert run(["models", "info", MODEL])[0] == 0 and run(["models", "list"])[0] == 0


def test_edited_partial_line_never_reaches_the_trace(tmp_path):
    from spec_repro.collect import PartialFileError, _append, _read_partial, _start_partial
    from spec_repro.profiler import RequestProfile

    part = tmp_path / "p.jsonl"
    _start_partial(part, {"n": 2})
    _append(part, [RequestProfile("a", WL, [1, 2], [3, 4]), RequestProfile("b", WL, [1], [5])])
    assert sorted(_read_partial(part, {"n": 2}, repair=False)) == ["a", "b"]
    lines = part.read_text().splitlines(keepends=True)
    part.write_text(lines[0] + lines[1].replace('"a"', '"z"') + lines[2])    # an edit in the middle: refused
    with pytest.raises(PartialFileError, match="line 2 is corrupt"):
        _read_partial(part, {"n": 2})
    part.write_text("".join(lines[:2]) + lines[2].replace("[5]", "[6]"))     # an edited last line: dropped
    assert sorted(_read_partial(part, {"n": 2})) == ["a"]
    head = lines[0].replace('"n": 2', '"n": 3')                              # edited settings: refused
    part.write_text(head + "".join(lines[1:]))
    with pytest.raises(PartialFileError, match="records no settings|corrupt"):
        _read_partial(part, {"n": 3})


def test_edited_workload_records_are_never_served(tmp_path, monkeypatch):
    from spec_repro.fetch import sha256_bytes
    from spec_repro.workloads import WorkloadError
    from spec_repro.workloads._base import WheelSource, cached_records

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path))
    d = tmp_path / "workloads" / "w"
    d.mkdir(parents=True)
    blob = (json.dumps({"id": "0", "messages": [{"role": "user", "content": "add 1 and 2"}], "meta": {}}) + "\n").encode()
    (d / "records.jsonl").write_bytes(blob)
    (d / "manifest.json").write_text(json.dumps({"version": 1, "records_sha256": sha256_bytes(blob)}))
    src = WheelSource("nothing==0", "0" * 64, "-", "-", ())
    never = lambda data: pytest.fail("rebuilt")  # noqa: E731
    assert cached_records("w", src, never)[0]["messages"][0]["content"] == "add 1 and 2"
    (d / "records.jsonl").write_bytes(blob.replace(b"add 1", b"rm -rf"))
    with pytest.raises(WorkloadError, match="do not match the sha256"):
        cached_records("w", src, never)


def test_tampered_trace_cache_entry_is_parsed_again(tmp_path, monkeypatch):
    from spec_repro.tracefiles import read_trace

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    good = read_trace(tr).acc
    (entry,) = (tmp_path / "cache" / "traces").glob("*.parquet")
    t = read_trace(tr)
    t.acc["acc_len"] = 1                                        # a valid parquet with other numbers
    t.to_parquet(entry)
    pd.testing.assert_frame_equal(read_trace(tr).acc, good)
    b = entry.read_bytes()
    entry.write_bytes(b[:-12] + b"\0" * 4 + b[-8:])            # a damaged footer
    pd.testing.assert_frame_equal(read_trace(tr).acc, good)


# ---- numbers ---------------------------------------------------------------------------------------------------
def _req_set(col, value):
    def f(acc):
        acc[col] = acc[col].astype(object)
        acc.loc[:, col] = value
        return acc
    return f


@pytest.mark.parametrize("name,mutate,pattern", [
    ("null-dataset", _req_set("dataset", None), r"'dataset' is null"),
    ("negative-prompt", _req_set("prompt_len", -100000), r"'prompt_len' = -100000"),
])
def test_trace_fields_validated(tmp_path, name, mutate, pattern):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spec_repro.tracefiles import read_trace

    t = read_trace(write_jsonl(tmp_path / "src.jsonl", good_records()))
    acc, req = mutate(t.acc.copy()), mutate(t.requests.copy())
    table = pa.Table.from_pandas(acc, preserve_index=False)
    md = {**(table.schema.metadata or {}), b"spec_repro.requests": req.to_json(orient="records").encode()}
    p = tmp_path / "t.parquet"
    pq.write_table(table.replace_schema_metadata(md), p)
    _check_error(*run(sim(p, tmp=tmp_path)), pattern)
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("path,value,pattern", [
    (("target", "c_tok"), 1e308, r"outside"),
    (("target", "c_kv"), 5e-324, r"outside"),
    (("overhead",), True, r"must be a number, got True"),
    (("target", "c0"), "0.001", r"must be a number"),
    (("drafters", "eagle", "c0"), 1e300, r"outside"),
])
def test_cost_model_numbers(tmp_path, path, value, pattern):
    def mutate(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    cm = cost_model(tmp_path, mutate)
    _check_error(*run(sim(tr, "--cost-model", cm, tmp=tmp_path, proposers="ngram,eagle",
                          policy=("oracle-combine",))), pattern)


@pytest.mark.parametrize("extra,pattern", [
    (["--lr", "inf"], r"--lr must be a finite number"),
    (["--lr", "nan"], r"--lr must be a finite number"),
    (["--lr", "-1"], r"--lr must be a finite number > 0"),
    (["--steps", "-1"], r"--steps must be an integer in 1"),
    (["--steps", "0"], r"--steps must be"),
    (["--ttt-depth", "0"], r"--ttt-depth must be"),
    (["--eval-n", "-1"], r"--eval-n must be"),
    (["--batch-size", "0"], r"--batch-size must be"),
    (["--tokens-per-batch", "0"], r"--tokens-per-batch must be"),
    (["--seed", "-1"], r"--seed must be"),
    (["--depth-decay", "0"], r"--depth-decay must be"),
    (["--depth-decay", "1.5"], r"--depth-decay must be"),
    (["--init-head", "/nonexistent/head"], r"^error: --init-head: EAGLE head .*no such directory"),
    (["--device", "cuda:7"] if not __import__("torch").cuda.is_available() else ["--device", "nodevice"],
     r"--device"),
])
def test_train_numbers_refused_before_loading(tmp_path, no_model, extra, pattern):
    _check_error(*run(TRAIN + ["--out", tmp_path / "h", *extra]), pattern)
    assert not (tmp_path / "h").exists()


COLLECT = ["collect", "--workloads", WL, "-n", "3", "--max-new-tokens", "8", "--batch-size", "1"]


@pytest.mark.parametrize("extra,pattern", [
    (["--seed", "-1"], r"--seed must be"),
    (["--device", "cuda"] if not __import__("torch").cuda.is_available() else ["--device", "bogus"],
     r"--device"),
    (["--device", "bogus:device"], r"not a torch device"),
])
def test_collect_numbers_and_device_refused_before_loading(tmp_path, no_model, extra, pattern):
    _check_error(*run(COLLECT + ["--out", tmp_path / "o", *extra]), pattern)


def test_workloads_show_chars_negative():
    _check_error(*run(["workloads", "show", WL, "--chars", "-5"]), r"--chars must be")


# ---- a finished trace resumed with other settings -------------------------------------------------------------
def _finished(tmp_path, **meta):
    from spec_repro.collect import trace_path
    from spec_repro.tracefiles import read_trace

    t = read_trace(write_jsonl(tmp_path / "src.jsonl", good_records()))
    t.meta.update(meta)
    p = trace_path(tmp_path / "o", MODEL, WL)
    t.to_parquet(p)
    return p


def _settings(**over):
    from spec_repro.collect import _norm_settings, _resume_settings

    s = _resume_settings(MODEL, WL, n=3, max_new_tokens=8, k_max=16, seed=0, proposers=["ngram"],
                         draft_model=None, early_exit_layers=None, min_n=3, max_n=7, max_prompt_tokens=1024,
                         batch_size=1, device="cpu")
    s.update(over)
    return _norm_settings(s)


@pytest.mark.parametrize("extra,pattern", [
    (["-n", "2"], r"other settings \(n 3 -> 2\)"),
    (["--k-max", "4"], r"k_max 16 -> 4"),
])
@pytest.mark.parametrize("style", ["new", "old"])
def test_finished_trace_with_other_settings_is_refused(tmp_path, no_model, extra, pattern, style):
    meta = {"resume_settings": _settings()} if style == "new" else \
        {"n": 3, "k_max": 16, "max_new_tokens": 8, "seed": 0, "max_prompt_tokens": 1024, "batch_size": 1}
    p = _finished(tmp_path, **meta)
    before = p.read_bytes()
    _check_error(*run(COLLECT + ["--proposers", "ngram", "--out", tmp_path / "o", *extra]),
                 pattern + r".*--force")
    assert p.read_bytes() == before


def test_finished_trace_with_same_settings_is_skipped(tmp_path, no_model):
    p = _finished(tmp_path, resume_settings=_settings())
    before = p.read_bytes()
    assert run(COLLECT + ["--proposers", "ngram", "--out", tmp_path / "o"])[0] == 0
    assert p.read_bytes() == before


# ---- tracebacks become one line --------------------------------------------------------------------------------
def test_damaged_user_parquet_is_one_line(tmp_path):
    p = parquet_trace(tmp_path)
    b = bytearray(p.read_bytes())
    i = b.find(b"ARROW:schema")
    for j in range(i + 20, i + 60):
        b[j] ^= 0x55
    p.write_bytes(bytes(b))
    code, msg = run(sim(p, tmp=tmp_path))
    assert code != 0 and msg.startswith("error: ") and "\n" not in msg.strip()


def test_string_token_ids_with_adaptive_rule(tmp_path):
    """Token ids written as strings give the same adaptive-rule speedups as the ints (no traceback)."""
    import copy

    recs = good_records(12)
    from spec_repro.profiler import ngram_acceptance

    for r in recs[::2]:
        r["generated_token_ids"] = (r["prompt_token_ids"] * 2)[:20]      # repeats: the n-gram proposer matches
    for r in recs:   # n-gram's arrays as the ids give them (the simulator checks that the ids belong to them)
        r["acc_ngram"] = {"acc_len": ngram_acceptance(r["prompt_token_ids"], r["generated_token_ids"], 20)[0].tolist()}
    strs = copy.deepcopy(recs)
    for r in strs:
        r["prompt_token_ids"] = [str(x) for x in r["prompt_token_ids"]]
        r["generated_token_ids"] = [str(x) for x in r["generated_token_ids"]]
    got = []
    for tag, rs in (("i", recs), ("s", strs)):
        out = tmp_path / f"{tag}.csv"
        code, msg = run(sim(write_jsonl(tmp_path / f"{tag}.jsonl", rs), "--batch-sizes", "1", "16", out=out,
                            proposers="ngram,eagle", policy=("adaptive-rule",)))
        assert code == 0, msg
        got.append(pd.read_csv(out).speedup.to_numpy())
    assert np.allclose(got[0], got[1], rtol=1e-12)


@pytest.mark.parametrize("name,files,pattern", [
    ("config-junk", {"config.json": b"\x00junk", "model.safetensors": b"x"}, r"config.json is not a readable"),
    ("config-list", {"config.json": b"[]", "model.safetensors": b"x"}, r"not a JSON object"),
    ("safetensors-header", {"config.json": b"{}", "model.safetensors": b"\xff" * 64}, r"not a readable safetensors"),
])
def test_junk_eagle_head_is_one_line_before_loading(tmp_path, no_model, name, files, pattern):
    h = tmp_path / "head"
    h.mkdir()
    for k, v in files.items():
        (h / k).write_bytes(v)
    _check_error(*run(COLLECT + ["--proposers", "ngram", "eagle", "--eagle-head", h, "--out", tmp_path / "o"]),
                 pattern)


def test_model_folder_without_config_is_one_line(tmp_path):
    d = tmp_path / "notamodel"
    d.mkdir()
    (d / "weights.txt").write_text("x")
    _check_error(*run(["cpu-verify-cost", "--model", d, "--out", tmp_path / "v.csv"]), r"without config.json")


def test_damaged_safetensors_in_a_model_folder_is_one_line(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
                                               "intermediate_size": 8, "num_hidden_layers": 1,
                                               "num_attention_heads": 1}))
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    code, msg = run(["cpu-verify-cost", "--model", d, "--out", tmp_path / "v.csv"])
    assert code != 0 and msg.startswith("error: ") and "\n" not in msg.strip(), msg
    assert not (tmp_path / "v.csv").exists()


@pytest.mark.parametrize("raw", ["{bad", "[]"])
def test_bad_manifest_found_before_any_work(tmp_path, no_model, raw):
    (tmp_path / "MANIFEST.json").write_text(raw)
    _check_error(*run(["cpu-verify-cost", "--out", tmp_path / "v.csv"]), r"MANIFEST.json.*nothing was written")
    assert not (tmp_path / "v.csv").exists()
    o = tmp_path / "o"
    o.mkdir()
    (o / "MANIFEST.json").write_text(raw)
    _check_error(*run(COLLECT + ["--out", o]), r"MANIFEST.json")


# ---- names: temporaries, long names, trailing slashes, symlinks --------------------------------------------------
def test_a_killed_writers_temp_is_removed_at_the_next_start(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    dead = tmp_path / ".out.csv.99999999.abcd.tmp"               # pid 99999999 cannot be running
    dead.write_bytes(b"")
    alive = tmp_path / f".out.csv.{os.getpid()}.efgh.tmp"        # a live writer's temporary stays
    alive.write_bytes(b"")
    assert run(sim(tr, tmp=tmp_path))[0] == 0
    assert not dead.exists() and alive.exists()
    alive.unlink()
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_250_byte_out_name_works(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    out = tmp_path / ("r" * 246 + ".csv")
    assert run(sim(tr, out=out, tmp=tmp_path))[0] == 0 and out.is_file()


def test_out_with_a_trailing_slash_is_a_folder_not_a_file(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    _check_error(*run(sim(tr, out=str(tmp_path / "newdir") + "/", tmp=tmp_path)), r"ends in '/'")
    assert not (tmp_path / "newdir").exists()


def test_out_a_symlink_is_written_through(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    real = tmp_path / "results" / "real.csv"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    assert run(sim(tr, out=link, tmp=tmp_path))[0] == 0
    assert link.is_symlink() and real.read_text().startswith("dataset,")


def test_no_hint_names_an_option_the_command_lacks():
    src = (Path(__file__).resolve().parents[1] / "spec_repro" / "engines" / "torch.py").read_text()
    assert "(--batch-size)" not in src                         # the command adds its own options' hint


def test_no_import_circle_between_schema_readers_and_models():
    """traces (the schema) imports no reader; published sits above it; models and provenance need no trace type
    to hash a file (spec_repro.fetch, below models and workloads, does)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "spec_repro"

    def imports(rel):
        tree = ast.parse((root / rel).read_text())
        out = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level and "TYPE_CHECKING" not in ast.unparse(n):
                out.add((n.module or "").split(".")[0] or n.names[0].name)
        return out

    assert not {"published", "tracefiles", "models", "provenance"} & imports("traces.py")
    assert not {"models", "provenance", "traces"} & imports("models.py")
    assert "models" not in imports("workloads/_base.py") and "fetch" in imports("workloads/_base.py")
    assert "traces" not in imports("fetch.py") and "models" not in imports("published.py")


@pytest.mark.parametrize("rid", [None, True, [1], ""])
def test_published_id_must_be_a_name(tmp_path, rid):
    recs = good_records()
    recs[0]["id"] = rid
    _check_error(*run(sim(write_jsonl(tmp_path / "i.jsonl", recs), tmp=tmp_path)), r"'id' must be a string")


def test_cost_model_integer_too_large_for_a_float(tmp_path):
    tr = write_jsonl(tmp_path / "x.jsonl", good_records())
    cm = cost_model(tmp_path, raw=json.dumps(PRESET).replace('"c0": 0.00588590713', '"c0": 1' + "0" * 400))
    _check_error(*run(sim(tr, "--cost-model", cm, tmp=tmp_path)), r"does not fit a float")


def test_collect_start_removes_a_killed_final_writes_temp(tmp_path, no_model):
    """SIGKILL during the final write of a trace leaves a hidden temporary; the next start removes it."""
    from spec_repro.collect import trace_path

    p = _finished(tmp_path, resume_settings=_settings())
    dead = p.parent / f".{p.name[:32]}.99999999.k1ll.tmp"
    dead.write_bytes(b"")
    assert run(COLLECT + ["--proposers", "ngram", "--out", tmp_path / "o"])[0] == 0
    assert not dead.exists() and trace_path(tmp_path / "o", MODEL, WL).exists()


# ---- a hostile-input run of cases the issue did not list: each is a clear line, nothing of the user's changes ---
def _hostile(tmp):
    """(name, args, pattern, files that must stay byte-identical) for new hostile cases."""
    tr = write_jsonl(tmp / "x.jsonl", good_records())
    (tmp / "sub").mkdir()
    full = tmp / "full"
    full.mkdir()
    (full / "a.txt").write_text("a")
    (tmp / "lnk").symlink_to(full)
    tgt = tmp / "tgt"
    tgt.mkdir()
    (tgt / "config.json").write_text("{}")
    (tmp / "dang").symlink_to(tmp / "nowhere" / "x")
    d = json.loads(json.dumps(PRESET))
    d["target"] = []
    (tmp / "cm_list.json").write_text(json.dumps(d))
    S = lambda out, *e: ["simulate", "--traces", tr, "--proposers", "ngram", "--policy", "oracle",  # noqa: E731
                         "--out", out, "--no-progress", *e]
    keep = [tr, full / "a.txt", tgt / "config.json"]
    return keep, [
        ("out-input-with-slash", S(str(tr) + "/"), r"ends in '/'"),
        ("out-input-via-dotdot", S(tmp / "sub" / ".." / "x.jsonl"), r"is also an input"),
        ("cm-target-list", S(tmp / "o.csv", "--cost-model", tmp / "cm_list.json"), r"target must be an object"),
        ("same-trace-twice", ["simulate", "--traces", tr, tr, "--proposers", "ngram", "--policy", "oracle",
                              "--out", tmp / "o.csv"], r"duplicate rows"),
        ("sample-negative", S(tmp / "o.csv", "--sample", "-1"), r"sample=-1"),
        ("out-name-300-bytes", S(tmp / ("a" * 300 + ".csv")), r"too long"),
        ("train-out-link-to-full-folder", ["train", "eagle", "--out", tmp / "lnk"], r"holding other files"),
        ("train-out-is-target", ["train", "eagle", "--target", tgt, "--out", tgt], r"is or holds an input"),
        ("train-out-home", ["train", "eagle", "--out", os.path.expanduser("~")], r"home folder"),
        ("train-train-n-0", ["train", "eagle", "--train-n", "0", "--out", tmp / "h"], r"--train-n must be"),
        ("train-train-n-not-int", ["train", "eagle", "--train-n", "sharegpt=many", "--out", tmp / "h"],
         r"--train-n takes N or WORKLOAD=N"),
        ("train-train-n-other-workload", ["train", "eagle", "--train-n", "100", "gsm-symbolic=5", "--out", tmp / "h"],
         r"'gsm-symbolic' is not among --workloads"),
        ("train-train-n-workload-0", ["train", "eagle", "--train-n", "sharegpt=0", "--out", tmp / "h"],
         r"--train-n sharegpt must be"),
        ("train-time-budget-0", ["train", "eagle", "--time-budget", "0", "--out", tmp / "h"], r"--time-budget must be"),
        ("train-lr-10", ["train", "eagle", "--lr", "10", "--out", tmp / "h"], r"--lr must be"),
        ("train-unknown-workload", ["train", "eagle", "--workloads", "nope", "--out", tmp / "h"], r"unknown workload"),
        ("collect-out-dangling-link", ["collect", "--workloads", WL, "--out", tmp / "dang"], r"dangling link"),
        ("collect-early-exit-0", ["collect", "--workloads", WL, "--early-exit-layers", "0", "--out", tmp / "c"],
         r"--early-exit-layers must be"),
        ("cvc-steps-out-is-out", ["cpu-verify-cost", "--out", tmp / "v.csv", "--steps-out", tmp / "v.csv"],
         r"is also an input"),
        ("cvc-kv-len-huge", ["cpu-verify-cost", "--kv-len", str(10 ** 12), "--out", tmp / "v.csv"], r"--kv-len"),
        ("cvc-device-gpu", ["cpu-verify-cost", "--device", "gpu", "--out", tmp / "v.csv"], r"not a torch device"),
        ("workloads-seed-negative", ["workloads", "show", WL, "--seed", "-3"], r"--seed must be"),
        ("reproduce-out-is-trace", ["reproduce", "--traces", tr, "--out", tr], r"is a file, not a folder"),
    ]


def test_train_accepts_every_training_workload(tmp_path, no_model):
    """--workloads ... py-write (and --train-n py-write=N) pass the workload checks: the run stops only at --out,
    checked after them (an unknown name stops before it), the model never loaded."""
    f = tmp_path / "f"
    f.write_text("x")
    args = ["train", "eagle", "--workloads", "sharegpt", "sharegpt-turns", "py-functions", "py-write",
            "--train-n", "100", "py-write=5", "--out", f]
    _check_error(*run(args), r"is a file, not a folder")
    _check_error(*run([a if a != "py-write" else "py-writ" for a in args]), r"not among --workloads")
    _check_error(*run(args[:6] + ["py-writ", "--out", f]), r"unknown workload 'py-writ'")
    assert f.read_text() == "x"


def test_hostile_new_cases(tmp_path, no_model):
    keep, cases = _hostile(tmp_path)
    before = {p: p.read_bytes() for p in keep}
    for name, args, pattern in cases:
        code, msg = run(args)
        assert code != 0 and msg.startswith("error: ") and "\n" not in msg.strip(), (name, msg)
        assert __import__("re").search(pattern, msg), (name, msg)
    assert {p: p.read_bytes() for p in keep} == before
    assert not (tmp_path / "h").exists() and not list(tmp_path.rglob("*.tmp*"))
    assert len(cases) >= 19
