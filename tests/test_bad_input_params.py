"""Cases of a hostile probe. Each ends in ONE clear ``error:`` line and a non-zero exit (or the
correct result); never a traceback, a silently dropped value or a stale folder left behind.

Fast: tiny fixtures, in-process CLI; the real model is never loaded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bad_input import _check_error, good_records, run, sim, write_jsonl


def test_dynamic_k_duplicate_batch_size_refused(tmp_path):
    t = write_jsonl(tmp_path / "t.jsonl", good_records())
    code, msg = run(sim(t, "--dynamic-k", "1:5", "1:2", tmp=tmp_path, proposers="eagle",
                        policy=("dynamic-k",)))
    _check_error(code, msg, "--dynamic-k.*batch size 1 more than one")
    assert not (tmp_path / "out.csv").exists()


# ---- 2: a cut MANIFEST.json is one line naming the file ----------------------------------------------------
def _cut_manifest(folder: Path) -> Path:
    man = folder / "MANIFEST.json"
    man.write_text('{"t.csv": {"date": "2026-01-01", "mod')
    return man


def _one_line_naming(e, man: Path):
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and "\n" not in msg and str(man) in msg, msg


def test_cut_manifest_readers_name_the_file(tmp_path):
    from spec_repro.measured import verify_cost
    from spec_repro.provenance import ManifestError, manifest_line, trace_provenance
    from spec_repro.published import read_draft_position_rates
    from spec_repro.tracefiles import read_trace

    man = _cut_manifest(tmp_path)
    (tmp_path / "t.csv").write_text("k,ratio\n0,1.0\n1,1.1\n")
    for call in (lambda: manifest_line(tmp_path, [tmp_path / "t.csv"]),
                 lambda: verify_cost(tmp_path / "t.csv"),
                 lambda: read_draft_position_rates(tmp_path / "t.csv")):
        with pytest.raises(ManifestError) as e:
            call()
        _one_line_naming(e, man)
    t = read_trace(write_jsonl(tmp_path / "x.jsonl", good_records()))
    t.meta["files"] = [str(tmp_path / "x.jsonl")]
    with pytest.raises(ManifestError) as e:
        trace_provenance(t)
    _one_line_naming(e, man)


def test_cut_manifest_add_proposers_refused_before_work(tmp_path, monkeypatch):
    from spec_repro import collect
    from spec_repro.provenance import ManifestError

    man = _cut_manifest(tmp_path)
    monkeypatch.setattr(collect, "read_trace", lambda *a, **k: pytest.fail("trace read before the manifest"))
    with pytest.raises(ManifestError) as e:
        collect.add_proposers(tmp_path / "t.parquet", {})
    _one_line_naming(e, man)


def test_manifest_error_is_one_line_at_the_cli(tmp_path, monkeypatch):
    """Any command that meets a cut manifest ends in one line (ManifestError is a user error)."""
    from spec_repro import cli
    from spec_repro.provenance import check_manifest

    man = _cut_manifest(tmp_path)
    args = cli.build_parser().parse_args(["workloads", "list"])
    args.func = lambda a: check_manifest(man)
    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {"parse_args": lambda self, a: args})())
    code, msg = run(["workloads", "list"])
    _check_error(code, msg, "MANIFEST.json: not a readable JSON manifest")


# ---- 3: a number past Python's int-string conversion limit in JSON lines -----------------------------------
def _huge_id_line(rec: dict, key: str = "id") -> str:
    return json.dumps({**rec, key: 0}).replace(f'"{key}": 0', f'"{key}": ' + "9" * 5000, 1)


def test_huge_request_id_in_jsonl_trace_is_one_line(tmp_path):
    recs = good_records()
    t = write_jsonl(tmp_path / "t.jsonl", [_huge_id_line(recs[0])] + recs[1:])
    code, msg = run(sim(t, tmp=tmp_path))
    _check_error(code, msg, r"t\.jsonl:1: a number too long to read")


def test_huge_number_in_acc_len_string_is_one_line(tmp_path):
    rec = good_records(1)[0]
    rec["acc_ngram"] = json.dumps([1] * 19 + [0]).replace("0]", "9" * 5000 + "]")
    code, msg = run(sim(write_jsonl(tmp_path / "t.jsonl", [rec]), tmp=tmp_path))
    _check_error(code, msg, r"t\.jsonl:1.*a number too long to read")


def test_huge_number_in_step_log_is_one_line(tmp_path):
    from spec_repro.traces import TraceError, read_step_records

    p = tmp_path / "steps.jsonl"
    p.write_text('{"step": ' + "9" * 5000 + "}\n")
    with pytest.raises(TraceError, match=r"steps\.jsonl:1: a number too long to read"):
        read_step_records(p)


# ---- 4: prompt_len must agree with prompt_token_ids --------------------------------------------------------
def test_jsonl_prompt_len_disagreeing_with_ids_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))  # no parse cached by an older reader
    recs = good_records()
    recs[1]["prompt_len"] = 7                   # 29 prompt_token_ids
    code, msg = run(sim(write_jsonl(tmp_path / "t.jsonl", recs), tmp=tmp_path))
    _check_error(code, msg, r"t\.jsonl:2: request '1': prompt_len 7 but 29 prompt_token_ids")
    recs[1]["prompt_len"] = 29                  # agreeing: read as before
    code, msg = run(sim(write_jsonl(tmp_path / "t.jsonl", recs), tmp=tmp_path))
    assert code == 0, msg


def test_parquet_prompt_len_disagreeing_with_ids_refused(tmp_path):
    from spec_repro.tracefiles import read_trace
    from spec_repro.traces import Trace

    t = read_trace(write_jsonl(tmp_path / "src.jsonl", good_records()))
    assert "prompt_token_ids" in t.requests.columns
    acc, req = t.acc.copy(), t.requests.copy()
    acc.loc[acc.request_id == "2", "prompt_len"] = 5
    req.loc[req.request_id == "2", "prompt_len"] = 5
    Trace(acc, req, t.meta).to_parquet(tmp_path / "t.parquet")
    code, msg = run(sim(tmp_path / "t.parquet", tmp=tmp_path))
    _check_error(code, msg, r"t\.parquet: request '2': prompt_len 5 but 29 prompt_token_ids")


# ---- 5: --k-max bounded by what the acc_len column holds, before any work ----------------------------------
@pytest.mark.parametrize("k_max,ok", [(32767, False), (32766, True)])
def test_collect_k_max_fits_acc_len_dtype_before_loading(tmp_path, monkeypatch, k_max, ok):
    import numpy as np

    from spec_repro import collect, models

    class Loaded(Exception):
        pass

    def load(*a, **k):
        raise Loaded
    monkeypatch.setattr(models, "load", load)
    args = dict(workloads=["code-edit"], n=1, max_new_tokens=1, proposers=["ngram"], k_max=k_max,
                batch_size=1, max_prompt_tokens=64, early_exit_layers=None, min_n=1, max_n=3)
    if ok:
        collect._check_args(**args)
        assert k_max + 1 <= np.iinfo(np.int16).max
        return
    with pytest.raises(ValueError, match=r"--k-max must be an integer in 1\.\.32,766, got 32767"):
        collect._check_args(**args)
    code, msg = run(["collect", "--model", "smollm2-135m", "--workloads", "code-edit",
                     "--out", tmp_path / "o", "--k-max", k_max])
    _check_error(code, msg, r"--k-max must be an integer in 1\.\.32,766, got 32767")


# ---- 6 / 7: model conversion: a killed run's folders, a full disk ------------------------------------------
MODEL = "smollm2-135m"


class _Stop(Exception):
    pass


@pytest.fixture
def fake_convert(tmp_path, monkeypatch):
    """``models.convert`` of the embedded model with the GGUF "fetched" and torch / transformers faked: the
    model ``from_pretrained`` returns is ``state["model"]`` (none: it raises _Stop). Gives (model folder,
    state)."""
    import sys
    import types

    from spec_repro import models

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    d = models.model_dir(MODEL)
    d.mkdir(parents=True)
    gguf = d / "m.gguf"
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(models, "fetch", lambda *a, **k: gguf)
    state: dict = {"model": None}

    def load(*a, **k):
        if state["model"] is None:
            raise _Stop
        return state["model"]
    tok = types.SimpleNamespace(chat_template="{{x}}",
                                save_pretrained=lambda p: (Path(p) / "tok.json").write_text("{}"))
    auto_m = types.SimpleNamespace(from_pretrained=load)
    auto_t = types.SimpleNamespace(from_pretrained=lambda *a, **k: tok)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(float32="float32"))
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoModelForCausalLM=auto_m,
                                                                          AutoTokenizer=auto_t))
    return d, state


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_convert_removes_folders_a_killed_conversion_left(fake_convert):
    import os

    from spec_repro import models

    d, _ = fake_convert
    dead, live = d / f".convert-{_dead_pid()}-abc", d / f".convert-{os.getpid()}-def"
    old = d / ".convert-k3x9q_2a"                      # an older version's name (no pid)
    stale = d / f".stale-{_dead_pid()}-123"           # a swap killed mid-way
    for f in (dead, live, old, stale):
        (f / "hf").mkdir(parents=True)
        (f / "hf" / "model.safetensors").write_bytes(b"\0" * 1000)
    with pytest.raises(_Stop):
        models.convert(MODEL, quiet=True)
    assert not dead.exists() and not old.exists() and not stale.exists()
    assert live.exists(), "a running conversion's folder was removed"


class _Model:
    """What convert asks of a model: a config, its parameters, ``save_pretrained`` (here: a full disk)."""

    def __init__(self, error):
        import types

        self.config, self.error = types.SimpleNamespace(), error

    def parameters(self):
        import types

        return [types.SimpleNamespace(numel=lambda: 150 * 2**20, element_size=lambda: 4)]

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 4096)   # half written, then the disk is full
        raise self.error


def _safetensor_full():
    from safetensors import SafetensorError

    return SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                           '"No space left on device" })')


@pytest.mark.parametrize("error", [_safetensor_full, lambda: OSError(28, "No space left on device")],
                         ids=["safetensors", "oserror"])
def test_convert_full_disk_is_one_line_and_cleans_up(fake_convert, error, capsys):
    import errno

    from spec_repro import models

    d, state = fake_convert
    assert errno.ENOSPC == 28
    state["model"] = _Model(error())
    with pytest.raises(models.ModelError) as e:
        models.convert(MODEL, quiet=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no space left") and "free " in msg, msg
    assert "needs about 601 MB" in msg, msg
    assert not [p for p in d.iterdir() if p.name.startswith(".convert-")], "the cut conversion was left"
    assert not models.converted_dir(MODEL).exists()


def test_convert_other_errors_still_raise(fake_convert):
    from spec_repro import models

    d, state = fake_convert
    state["model"] = _Model(RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        models.convert(MODEL, quiet=True)
    assert not [p for p in d.iterdir() if p.name.startswith(".convert-")]
