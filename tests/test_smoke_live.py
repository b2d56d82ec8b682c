"""Live smoke of the whole embedded path: fetch the real SmolLM2-135M (model cache reused across runs), load
two real code-edit requests, decode 16 tokens each, profile n-gram + early-exit, write and re-read the trace.
Also checks that an interrupted collection resumes without redoing finished requests."""
import json
import platform

import numpy as np
import pytest

import spec_repro.collect as collect_mod
from spec_repro import models
from spec_repro.tracefiles import read_trace

# the collections below take code-edit's requests of at most 128 prompt tokens (the first two: 118 and 125 tokens,
# where the first two without a limit have 349 and 402): nothing checked here depends on a prompt's length, and a
# CPU decodes the short ones in far less time
SHORT = 128


@pytest.mark.slow
def test_live_collect_smoke_and_resume(tmp_path, monkeypatch):
    assert models.fetch("smollm2-135m").exists()
    real = collect_mod.profile_requests
    seen = []

    def interrupted(target, todo, *a, **kw):
        for batch in real(target, todo, *a, **kw):
            yield batch
            raise KeyboardInterrupt  # killed after the first finished request

    monkeypatch.setattr(collect_mod, "profile_requests", interrupted)
    kw = dict(n=2, max_new_tokens=16, proposers=("ngram", "early-exit"), out=tmp_path, batch_size=1, quiet=True,
              max_prompt_tokens=SHORT)
    with pytest.raises(KeyboardInterrupt):
        collect_mod.collect("smollm2-135m", ["code-edit"], **kw)
    part = collect_mod.partial_path(tmp_path, "smollm2-135m", "code-edit")
    assert len(part.read_text().splitlines()) == 2  # the settings header + one finished request
    assert not collect_mod.trace_path(tmp_path, "smollm2-135m", "code-edit").exists()

    def counting(target, todo, *a, **kw):
        seen.extend(r.id for r in todo)
        yield from real(target, todo, *a, **kw)

    monkeypatch.setattr(collect_mod, "profile_requests", counting)
    (path,) = collect_mod.collect("smollm2-135m", ["code-edit"], **kw)
    assert len(seen) == 1  # the finished request was not decoded again
    assert path.name == "smollm2-135m__code-edit.parquet" and not part.exists()

    t = read_trace(path)
    assert t.proposers == ["early-exit", "ngram"] and t.datasets == ["code-edit"] and len(t.requests) == 2
    assert (t.requests.output_len <= 16).all() and (t.requests.output_len >= 1).all()
    assert t.requests.prompt_text.str.len().min() > 0 and t.requests.output_text.notna().all()
    assert (t.acc.k_max == 16).all()
    man = json.loads((tmp_path / "MANIFEST.json").read_text())[path.name]
    assert man["model_file_sha256"] == models.spec("smollm2-135m").gguf_sha256
    assert man["workload"] == "code-edit" and man["n_requests"] == 2 and "versions" in man and "machine" in man


@pytest.mark.slow
def test_short_outputs_are_left_out_of_the_trace_and_reported_apart(tmp_path):
    """``min_output_len``: mt-bench's fifth request of the draw (``mt-bench/105``) is one SmolLM2 answers in 10
    tokens (the committed SmolLM2 mt-bench trace); with 12 new tokens at most and a minimum of 12 it alone is left
    out of the trace, and the manifest entry and the trace meta list it with its length and text."""
    (path,) = collect_mod.collect("smollm2-135m", ["mt-bench"], n=5, max_new_tokens=12, proposers=("ngram",),
                                  out=tmp_path, batch_size=5, quiet=True, min_output_len=12)
    t = read_trace(path)
    assert len(t.requests) == 4 and (t.requests.output_len == 12).all()
    assert "mt-bench/105" not in set(t.requests.request_id)
    man = json.loads((tmp_path / "MANIFEST.json").read_text())[path.name]
    short = man["short_outputs"]
    assert (short["ids"], short["output_len"], short["requests"], short["of_decoded"]) == (["mt-bench/105"], [10], 1, 5)
    assert short["output_text"][0] and man["n_requests"] == 4 and t.meta["short_outputs"] == short
    from spec_repro import analysis as A

    assert "1 of 5 decoded outputs under 12 tokens left out" in A.trace_provenance(A.load_traces([path]))
    with pytest.raises(ValueError, match="--min-output-len"):
        collect_mod.collect("smollm2-135m", ["mt-bench"], n=5, max_new_tokens=12, out=tmp_path, quiet=True,
                            min_output_len=13)


def test_collect_errors_before_loading_anything(tmp_path):
    with pytest.raises(ValueError, match="draft-model"):
        collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("draft",), out=tmp_path, quiet=True)
    with pytest.raises(ValueError, match="unknown proposer"):
        collect_mod.build_proposers(["medusa"], target=None)
    with pytest.raises(ValueError, match="needs --eagle-head"):
        collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("eagle",), out=tmp_path, quiet=True)


@pytest.mark.slow
def test_live_engine_step_timings_follow_the_schema():
    from spec_repro.traces import validate_steps

    # gsm-symbolic: its first request has 83 prompt tokens (code-edit's, the default workload's, 349); the schema
    # does not depend on the prompt
    df = validate_steps(collect_mod.engine_step_timings(workload="gsm-symbolic", n=1, max_new_tokens=6,
                                                        batch_sizes=(1, 2), quiet=True))
    assert set(df.method) == {"none", "ngram", "early_exit"} and set(df.batch_size) == {1, 2}
    dec = df[df.phase == "decode"]
    assert (dec.t_verify > 0).all() and (dec[dec.method == "none"].num_draft_tokens == 0).all()
    assert (dec[dec.method == "early_exit"].num_draft_tokens > 0).all()


@pytest.mark.slow
def test_live_adding_a_proposer_to_a_trace_matches_the_decode_readout(tmp_path):
    """A trace collected with n-gram only, then given early-exit from its stored tokens (teacher-forced pass),
    holds the same early-exit arrays as a collection that read them out during the decode."""
    kw = dict(n=2, max_new_tokens=16, out=tmp_path, batch_size=2, quiet=True, max_prompt_tokens=SHORT)
    (both,) = collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram", "early-exit"), **kw)
    want = read_trace(both).arrays("early-exit")
    both.unlink()
    (only,) = collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram",), **kw)
    assert read_trace(only).proposers == ["ngram"]
    collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram", "early-exit"), **kw)
    t = read_trace(only)
    assert t.proposers == ["early-exit", "ngram"]
    got = t.arrays("early-exit")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    man = json.loads((tmp_path / "MANIFEST.json").read_text())[only.name]
    assert man["added_proposers"] == ["early-exit"] and set(man["mean_acc_len"]) == {"early-exit", "ngram"}


def test_reprofile_replaces_a_proposer_from_stored_ids_without_loading_what_it_does_not_need(tmp_path, monkeypatch):
    """--reprofile early-exit on a finished trace profiles it again (its rows replaced, not doubled, equal to a
    fresh profile: the same model) and loads no draft model, since 'draft' is not profiled again."""
    kw = dict(n=2, max_new_tokens=16, out=tmp_path, batch_size=2, quiet=True, max_prompt_tokens=SHORT)
    (path,) = collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram", "early-exit"), **kw)
    before = read_trace(path)
    from spec_repro import models

    loaded, real_load = [], models.load
    monkeypatch.setattr(models, "load", lambda name, *a, **k: (loaded.append(name), real_load(name, *a, **k))[1])
    with pytest.raises(ValueError, match="not among --proposers"):
        collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram",), reprofile=["early-exit"], **kw)
    collect_mod.collect("smollm2-135m", ["code-edit"], proposers=("ngram", "early-exit"), reprofile=["early-exit"],
                        **kw)
    after = read_trace(path)
    assert loaded == ["smollm2-135m"] and len(after.acc) == len(before.acc)
    want, got = before.arrays("early-exit"), after.arrays("early-exit")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    man = json.loads((tmp_path / "MANIFEST.json").read_text())[path.name]
    assert list(man["reprofiled"]) == ["early-exit"] and man["original_run"]["date"]
    when, on = man["reprofiled"]["early-exit"].split(" on ")       # when and where it was profiled again
    assert when >= man["original_run"]["date"] and on == (platform.processor() or platform.machine())
    assert "early-exit" not in man["added_proposers"] and man["confidence"]["proposers"] == ["early-exit"]
    # the confidence of the teacher-forced pass equals the decode's read-out up to the stored 8-bit step
    cb, ca = before.confidence("early-exit"), after.confidence("early-exit")
    for k in cb:
        assert (np.isnan(cb[k]) == np.isnan(ca[k])).all() and not np.isnan(cb[k][0]).all()
        assert np.nanmax(np.abs(cb[k] - ca[k])) <= 1 / 254 + 1e-6
    from spec_repro.proposers import make_proposer

    with pytest.raises(ValueError, match="already holds"):
        collect_mod.add_proposers(path, {"ngram": make_proposer("ngram", None)}, quiet=True)
