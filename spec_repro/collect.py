"""Collect acceptance traces on real models and workloads (``spec-repro collect``).

For each workload: load ``n`` requests through the model's chat template, decode each greedily once (batched)
and profile every proposer at every output position (:mod:`spec_repro.profiler`). Finished requests are appended
to ``<out>/.partial/<model>__<workload>.jsonl`` as they complete, so an interrupted run resumes where it stopped;
when a workload is complete its trace is written atomically to ``<out>/<model>__<workload>.parquet`` (and the
partial file removed) with an entry in ``<out>/MANIFEST.json`` (the file's sha256, which readers check it
against; model file sha256, workload source, package versions, command, machine, date, settings, decode speed).

Resuming is exact and safe: the partial file's first line records the settings that shape the outputs, and a
resume with other settings is refused (naming the file; ``force=True`` discards it); a last line cut by a kill
or a full disk is dropped and truncated away before appending; requests are decoded in the same batches as an
uninterrupted run (a batch cut short is decoded again whole), so a run killed at any moment and resumed writes
the same trace. One process at a time writes a given output (a lock per trace file, ``LockedError`` otherwise).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

from .metrics import split_by_output_len
from .profiler import RequestProfile, profile_requests, profiles_to_trace
from .proposers.eagle_files import head_identity
from .provenance import machine_name, record, sha256_file
from .tracefiles import read_trace

__all__ = ["collect", "trace_path", "partial_path", "build_proposers"]


def trace_path(out: str | Path, model: str, workload: str) -> Path:
    return Path(out) / f"{_safe(model)}__{workload}.parquet"


def partial_path(out: str | Path, model: str, workload: str) -> Path:
    return Path(out) / ".partial" / f"{_safe(model)}__{workload}.jsonl"


def _safe(name: str) -> str:
    return name.replace("/", "--")


def build_proposers(names: Sequence[str], target, *, draft_model=None, early_exit_layers: int | None = None,
                    min_n: int = 3, max_n: int = 7, eagle_head=None) -> dict:
    """{trace name: proposer} for the profiler."""
    from .proposers import make_proposer

    out = {}
    for n in names:
        p = make_proposer(n, target, min_n=min_n, max_n=max_n, draft_model=draft_model, layers=early_exit_layers,
                          eagle_head=eagle_head)
        out[p.name] = p
    return out


_PARTIAL_KEY = "spec_repro_partial"


class PartialFileError(ValueError):
    """A partial file that cannot be resumed (other settings, corrupt); the message names it and ``--force``."""


def _norm_settings(settings: dict) -> dict:
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def _read_partial(path: Path, settings: dict | None = None, repair: bool = True) -> dict[str, RequestProfile]:
    """Profiles of a partial file. Its first line records the settings it was started with: a resume with other
    ``settings`` is refused. A last line cut by a kill (or a full disk) is dropped and, with ``repair``, truncated
    away so that new lines are appended after intact ones; any other unreadable line is an error."""
    done: dict[str, RequestProfile] = {}
    if not path.exists():
        return done
    data = path.read_bytes()
    lines, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end + 1
        lines.append((start, data[start:end]))
        start = end
    header = None
    hint = f"rerun with --force to discard it (or delete {path})"
    for i, (off, raw) in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            continue
        try:
            rec = json.loads(_unseal(raw))
            if header is None:
                if not isinstance(rec, dict) or _PARTIAL_KEY not in rec:
                    raise PartialFileError(f"{path} records no settings (written by an older version or another "
                                           f"tool), so it cannot be resumed safely; {hint}")
                header = rec
                _check_settings(path, header, settings, hint)
                continue
            if not raw.endswith(b"\n"):
                raise ValueError("cut line")  # complete JSON but no newline: the write was cut before it
            p = RequestProfile.from_json(rec)
        except PartialFileError:
            raise
        except (ValueError, TypeError, RecursionError):
            if not last:
                raise PartialFileError(f"{path}: line {i + 1} is corrupt (not a cut last line); {hint}") from None
            if repair:  # a line cut by a kill: everything before it is intact; drop it before appending
                with open(path, "r+b") as f:
                    f.truncate(off)
                    f.flush()
                    os.fsync(f.fileno())
            break
        done[p.request_id] = p
    if header is None:
        if repair:
            path.unlink()  # killed while the header was written: nothing to resume
        return {}
    return done


def _check_settings(path: Path, header: dict, settings: dict | None, hint: str) -> None:
    if settings is None or header.get("settings") == _norm_settings(settings):
        return
    have = header.get("settings") if isinstance(header.get("settings"), dict) else {}
    want = _norm_settings(settings)
    diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    shown = ", ".join(f"{k} {have.get(k)!r} -> {want.get(k)!r}" for k in diff[:4])
    raise PartialFileError(f"{path} was started with other settings ({shown}); rerun with the same settings to "
                           f"resume, or {hint}")


def _seal(body: str) -> str:
    """A partial-file line: the sha256 of its JSON (first 32 hex digits), a space, the JSON. A line edited or
    damaged on disk no longer matches and is refused; lines of older versions (bare JSON) still read."""
    import hashlib

    return hashlib.sha256(body.encode()).hexdigest()[:32] + " " + body


def _unseal(raw: bytes) -> bytes:
    import hashlib

    if raw[:1] in (b"{", b"["):      # bare JSON: the format before checksums (and hand-written test files)
        return raw
    digest, _, body = raw.partition(b" ")
    if len(digest) != 32 or hashlib.sha256(body.rstrip(b"\n")).hexdigest()[:32].encode() != digest:
        raise ValueError("checksum mismatch")
    return body


def _start_partial(path: Path, settings: dict) -> None:
    from .io import atomic_write

    with atomic_write(path) as f:
        f.write(_seal(json.dumps({_PARTIAL_KEY: 1, "settings": _norm_settings(settings)})) + "\n")


_NOT_COMPARED = ("proposers",)  # proposers may be added to a finished trace


def _check_finished(path: Path, meta: dict, settings: dict) -> None:
    """Refuse, as for a partial file, a run over a finished trace whose outputs other settings would shape
    (``-n``, ``--k-max``, ``--max-new-tokens``, ``--seed`` ...): the trace would silently keep the old ones.
    Adding proposers is allowed (``add_proposers``); traces of older versions are compared on what they record."""
    want = _norm_settings(settings)
    have = meta.get("resume_settings")
    if not isinstance(have, dict):          # older traces: the settings dict their meta carries
        have = {k: meta[k] for k in ("n", "k_max", "max_new_tokens", "seed", "max_prompt_tokens", "batch_size")
                if k in meta}
        ng = (meta.get("proposers") or {}).get("ngram") if isinstance(meta.get("proposers"), dict) else None
        if isinstance(ng, dict) and "ngram" in want.get("proposers", []):
            have.update({k: ng[k] for k in ("min_n", "max_n") if k in ng})
    diff = sorted(k for k in have if k not in _NOT_COMPARED and k in want and have[k] != want[k])
    if diff:
        shown = ", ".join(f"{k} {have[k]!r} -> {want[k]!r}" for k in diff[:4])
        raise PartialFileError(f"{path} is a finished trace collected with other settings ({shown}); rerun with "
                               f"the same settings to reuse it, use another --out, or rerun with --force to "
                               f"collect it again")


def _resume_settings(model, workload, **kw) -> dict:
    """What shapes a partial file's outputs (known before the model loads)."""
    return {"model": model, "workload": workload, **kw}


def _append(path: Path, profiles: Sequence[RequestProfile]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for p in profiles:
            f.write(_seal(json.dumps(p.to_json())) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _model_provenance(name: str) -> dict:
    from . import models

    try:
        i = models.info(name)
        return {"model_file": i.get("gguf_file"), "model_file_sha256": i.get("gguf_sha256"),
                "model_source": i.get("source"), "model_hf_id": i.get("hf_id"), "model_license": i.get("license"),
                "model_quantization": i.get("quantization"), "converted_sha256": i.get("converted_sha256")}
    except Exception:  # HF ids / local directories: no pinned file
        return {"model_file": name, "model_file_sha256": None}


def _workload_provenance(name: str) -> dict:
    from . import workloads

    fn = getattr(workloads, "describe", None) or getattr(workloads, "info", None)
    if fn is not None:
        try:
            return {"workload_source": fn(name)}
        except Exception:
            pass
    from .models import cache_root

    m = cache_root() / "workloads" / name / "manifest.json"
    return {"workload_source": json.loads(m.read_text())} if m.exists() else {}


def collect(model: str, workloads: Sequence[str], *, n: int = 40, max_new_tokens: int = 256,
            proposers: Sequence[str] = ("ngram", "early-exit"), out: str | Path = "data/traces", k_max: int = 16,
            batch_size: int = 8, seed: int = 0, max_prompt_tokens: int = 1024, draft_model: str | None = None,
            early_exit_layers: int | None = None, min_n: int = 3, max_n: int = 7, device: str = "cpu",
            force: bool = False, quiet: bool = False, eagle_head: str | None = None, engine: str = "torch",
            compare_engines: int = 0, upto: bool = False, reprofile: Sequence[str] = (),
            min_output_len: int = 0) -> list[Path]:
    """Collect one trace file per workload; returns their paths. See the module doc.

    ``engine="vllm"`` (a GPU host): vLLM decodes every request (one engine for all workloads), then the proposers
    are profiled over its outputs by teacher forcing on ``device``; decoded outputs are kept beside the partial
    file, so a resume never decodes again. ``compare_engines=N``: the first N requests of the first workload are
    also decoded by vLLM and by the torch engine alone (at most 256 new tokens each, batch N), and both output
    tokens/s go into the manifest (also when nothing is left to decode). ``upto``: ``n`` is an upper bound (a
    workload with fewer requests gives them all, e.g. humaneval's 164 and mt-bench's 80 beside 300 of the
    others). ``reprofile``: proposers profiled again on finished traces from their stored token ids (a retrained
    head), replacing their rows; each must be among ``proposers``. ``min_output_len``: requests whose greedy
    output is shorter (a greeting, a refusal) are left out of the trace and reported apart, in the manifest entry's
    and the trace meta's ``short_outputs`` (their ids, output lengths and texts)."""
    import contextlib

    from . import workloads as wl
    from .engines.vllm.decode import check_engine

    check_engine(engine, device)
    if isinstance(compare_engines, bool) or not isinstance(compare_engines, int) or compare_engines < 0:
        raise ValueError(f"--compare-engines must be an integer >= 0, got {compare_engines!r}")
    if compare_engines and engine != "vllm":
        raise ValueError("--compare-engines compares vLLM with the torch engine: it needs --engine vllm")
    reprofile = sorted({_trace_name(p) for p in reprofile})
    unknown = sorted(set(reprofile) - {_trace_name(p) for p in proposers})
    if unknown:
        raise ValueError(f"--reprofile {' '.join(unknown)}: not among --proposers {' '.join(proposers)}")

    workloads = list(dict.fromkeys(workloads))          # a workload named twice is collected once
    _check_args(workloads=workloads, n=n, max_new_tokens=max_new_tokens, proposers=proposers, k_max=k_max,
                batch_size=batch_size, max_prompt_tokens=max_prompt_tokens, early_exit_layers=early_exit_layers,
                min_n=min_n, max_n=max_n, seed=seed, min_output_len=min_output_len)
    from .guard import check_device, out_dir
    from .provenance import check_manifest

    check_device(device)
    for w in workloads:
        wl.describe(w)                                   # unknown workload -> clear error before any work
    if any(_trace_name(p).startswith("eagle") for p in proposers):
        from .proposers.eagle import check_head_dir

        eagle_head = str(check_head_dir(eagle_head))
    local = [x for x in (model, draft_model, eagle_head) if x and Path(x).expanduser().exists()]
    out = out_dir(out, "--out", inputs=local,  # also removes temporaries a killed run left beside its outputs
                  writes=["MANIFEST.json", *(trace_path(".", model, w).name for w in workloads)])
    check_manifest(out / "MANIFEST.json")              # a damaged manifest is found now, not after the run
    with contextlib.ExitStack() as locks:
        from .io import exclusive_lock

        for w in workloads:
            locks.enter_context(exclusive_lock(partial_path(out, model, w).with_suffix(".lock"),
                                               f"{trace_path(out, model, w)}"))
        return _collect_locked(model, workloads, n=n, max_new_tokens=max_new_tokens, proposers=proposers, out=out,
                               k_max=k_max, batch_size=batch_size, seed=seed, max_prompt_tokens=max_prompt_tokens,
                               draft_model=draft_model, early_exit_layers=early_exit_layers, min_n=min_n,
                               max_n=max_n, device=device, force=force, quiet=quiet, eagle_head=eagle_head,
                               engine=engine, compare_engines=compare_engines, upto=upto, reprofile=reprofile,
                               min_output_len=min_output_len)


def _check_args(*, workloads, n, max_new_tokens, proposers, k_max, batch_size, max_prompt_tokens,
                early_exit_layers, min_n, max_n, seed=0, min_output_len=0) -> None:
    """Refuse settings that cannot make a trace, before the model loads (one clear line each)."""
    from .simulate import MAX_K

    def want(name, v, lo, hi=2**31 - 1):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{name} must be an integer in {lo}..{hi:,}, got {v!r}")

    if not list(workloads):
        raise ValueError("no workloads given")
    if not list(proposers):
        raise ValueError("no proposers given")
    want("-n", n, 1)
    want("--max-new-tokens", max_new_tokens, 1)
    want("--k-max", k_max, 1, MAX_K - 1)  # acc_len reaches k_max + 1, which the int16 column must hold
    want("--batch-size", batch_size, 1, 65536)
    want("--max-prompt-tokens", max_prompt_tokens, 1)
    want("--min-output-len", min_output_len, 0, max_new_tokens)
    want("--min-n", min_n, 1)
    want("--max-n", max_n, min_n)
    want("--seed", seed, 0, 2**63 - 1)
    if early_exit_layers is not None:
        want("--early-exit-layers", early_exit_layers, 1)


def _collect_locked(model, workloads, *, n, max_new_tokens, proposers, out, k_max, batch_size, seed,
                    max_prompt_tokens, draft_model, early_exit_layers, min_n, max_n, device, force, quiet,
                    eagle_head=None, engine="torch", compare_engines=0, upto=False, reprofile=(),
                    min_output_len=0):
    from .progress import tqdm

    from . import models

    def resume_settings(w):
        return _resume_settings(model, w, n=n, max_new_tokens=max_new_tokens, k_max=k_max, seed=seed,
                                proposers=sorted(_trace_name(p) for p in proposers), draft_model=draft_model,
                                early_exit_layers=early_exit_layers, min_n=min_n, max_n=max_n,
                                max_prompt_tokens=max_prompt_tokens, batch_size=batch_size, device=str(device),
                                **({"min_output_len": min_output_len} if min_output_len else {}),
                                **({"eagle_head": head_identity(eagle_head)} if eagle_head else {}),
                                **({"engine": engine} if engine != "torch" else {}))

    if force:  # --force redoes the workloads from scratch: a partial file of an earlier run goes too
        for w in workloads:
            partial_path(out, model, w).unlink(missing_ok=True)
    # a partial file left next to a finished trace means a run died while finishing (or during a --force redo):
    # that workload is finished from the partial file again
    todo_wl = [w for w in workloads if force or not trace_path(out, model, w).exists()
               or partial_path(out, model, w).exists()]
    for w in todo_wl:       # refuse a resume with other settings before the model loads
        _read_partial(partial_path(out, model, w), resume_settings(w))
    paths = [trace_path(out, model, w) for w in workloads]
    wanted = {_trace_name(p) for p in proposers}
    augment = {}
    for w in workloads:
        if w in todo_wl:
            continue
        finished = read_trace(trace_path(out, model, w))
        _check_finished(trace_path(out, model, w), finished.meta, resume_settings(w))
        have = set(finished.proposers)
        if (wanted - have) or set(reprofile):
            augment[w] = sorted((wanted - have) | set(reprofile))
        elif not quiet:
            print(f"[collect] {trace_path(out, model, w)} exists with {sorted(have)}, skipped (--force to redo)")
    if not todo_wl and not augment and not compare_engines:
        return paths
    if "draft" in proposers and not draft_model:
        raise ValueError("proposer 'draft' needs --draft-model NAME (a model sharing the target's tokenizer)")
    # the proposers profiled by this run: all of them for a workload to collect, else only those added
    added = {x for v in augment.values() for x in v}
    needed = list(proposers) if todo_wl else [p for p in proposers if _trace_name(p) in added]
    target, tok = models.load(model, device=device)
    drafter = None
    if draft_model and any(_trace_name(p) == "draft" for p in needed):
        drafter, dtok = models.load(draft_model, device=device)
        if dtok.get_vocab() != tok.get_vocab():
            raise ValueError(f"draft model {draft_model!r} does not share {model!r}'s tokenizer")
    props = build_proposers(needed, target, draft_model=drafter, early_exit_layers=early_exit_layers,
                            min_n=min_n, max_n=max_n, eagle_head=eagle_head)
    settings = {"proposers": {p.name: _proposer_settings(p, draft_model) for p in props.values()},
                "k_max": k_max, "max_new_tokens": max_new_tokens, "n": n, "seed": seed,
                "max_prompt_tokens": max_prompt_tokens, "batch_size": batch_size, "device": device,
                "decoding": "greedy", "engine": "spec_repro.engines.torch", "dtype": str(target.dtype)}
    decoded: dict = {}
    if engine == "vllm":
        decoded, vstats = _vllm_decode(model, todo_wl, target, tok, out=out, n=n, seed=seed,
                                       max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                                       settings_of=resume_settings, compare=compare_engines, quiet=quiet,
                                       upto=upto, compare_workload=workloads[0])
        settings.update(engine="vllm", decode_engine=vstats, dtype="bfloat16 (vLLM decode); "
                        f"{target.dtype} (profiling passes)", profiling="teacher-forced over vLLM's outputs")
        if "engine_comparison" in vstats:
            record(out / "MANIFEST.json", f"engine_comparison:{_safe(model)}", **vstats["engine_comparison"],
                   model=model, **_model_provenance(model),
                   kind="decode throughput, vLLM vs the torch engine (measured, same requests, each alone)")
            _comparison_path(out).unlink(missing_ok=True)   # recorded: the interrupted-run copy is done with
    for w, missing in augment.items():
        add_proposers(trace_path(out, model, w), {n: props[n] for n in missing}, quiet=quiet, replace=True,
                      settings={n: _proposer_settings(props[n], draft_model) for n in missing},
                      provenance=_model_provenance(draft_model) if draft_model and "draft" in missing else None)
    for w in todo_wl:
        final, part = trace_path(out, model, w), partial_path(out, model, w)
        reqs = _load(w, n, seed, tok, max_prompt_tokens, upto)
        if not part.exists():
            _start_partial(part, resume_settings(w))
        done = _read_partial(part, resume_settings(w))
        ids = {str(r.id) for r in reqs}
        # the batches of an uninterrupted run (shortest prompts first); a batch cut short by a kill is decoded
        # again whole, so that every request is decoded beside the same neighbours as without the kill
        order = sorted(reqs, key=lambda r: len(r.prompt_token_ids))
        batches = [order[b: b + batch_size] for b in range(0, len(order), batch_size)]
        bar = tqdm(total=len(reqs), initial=len(ids & set(done)), desc=f"{model} {w}", unit="req",
                   disable=quiet)
        t0, toks = time.time(), 0
        for todo in batches:
            if all(str(r.id) in done for r in todo):
                continue
            if engine == "vllm":
                from .profiler import profile_decoded

                dec = decoded[w]
                gen = [profile_decoded(todo, [dec[str(r.id)][0] for r in todo], props, k_max=k_max, tokenizer=tok,
                                       dataset=w, decode_s=[dec[str(r.id)][1] for r in todo])]
            else:
                gen = profile_requests(target, todo, props, k_max=k_max, max_new_tokens=max_new_tokens,
                                       batch_size=len(todo), tokenizer=tok, dataset=w)
            for batch in gen:
                batch = [p for p in batch if p.request_id not in done]
                _append(part, batch)
                toks += sum(len(p.output_token_ids) for p in batch)
                bar.update(len(batch))
                bar.set_postfix(tok_s=f"{toks / max(time.time() - t0, 1e-9):.1f}")
        bar.close()
        done = _read_partial(part, resume_settings(w))
        missing = [str(r.id) for r in reqs if str(r.id) not in done]
        if missing:
            raise RuntimeError(f"{part}: {len(missing)} request(s) missing after collection (e.g. {missing[0]!r})")
        profiles = [done[str(r.id)] for r in reqs if str(r.id) in done]
        decode_s = sum(p.decode_s for p in profiles)
        out_toks = sum(len(p.output_token_ids) for p in profiles)
        meta = {"model": model, "workload": w, **settings, "resume_settings": _norm_settings(resume_settings(w)),
                "decode_tokens_per_s": out_toks / decode_s if decode_s else None}
        trace = profiles_to_trace(profiles, model=model, k_max=k_max, meta=meta)
        short = None
        if min_output_len:                       # short outputs reported apart (metrics.split_by_output_len)
            trace, cut = split_by_output_len(trace, min_output_len)
            if not len(trace.requests):
                raise RuntimeError(f"{w}: every output is shorter than --min-output-len {min_output_len}")
            short = _short_outputs(cut, min_output_len, decoded=len(profiles))
            if short:
                trace.meta["short_outputs"] = short
        trace.to_parquet(final)
        summary = {p: round(float(trace.acc[trace.acc.proposer == p].acc_len.mean()), 3) for p in trace.proposers}
        record(out / "MANIFEST.json", final.name, file=final.name, sha256=sha256_file(final), workload=w,
               n_requests=len(trace.requests),
               output_tokens=int(trace.requests["output_len"].sum()), mean_acc_len=summary, **settings,
               **_model_provenance(model),
               **({"draft_model": draft_model, **{f"draft_{k}": v for k, v in _model_provenance(draft_model).items()}}
                  if draft_model else {}),
               **_workload_provenance(w), decode_tokens_per_s=meta["decode_tokens_per_s"],
               **_confidence_entry(trace), **({"short_outputs": short} if short else {}),
               kind="acceptance trace (measured: real greedy decodes + exact per-position profiling)")
        part.unlink(missing_ok=True)
        _decoded_path(part).unlink(missing_ok=True)
        if not quiet:
            print(f"[collect] wrote {final} ({len(trace.requests)} requests, {out_toks} output tokens decoded, "
                  f"mean acc_len {summary})")
    return paths


def _short_outputs(cut, min_len: int, decoded: int) -> dict | None:
    """The record of the outputs shorter than ``min_len`` tokens (``cut``: their trace), reported apart from the
    trace; None when there are none."""
    r = cut.requests
    if not len(r):
        return None
    return {"min_output_len": min_len, "requests": len(r), "of_decoded": decoded, "ids": r["request_id"].tolist(),
            "output_len": [int(x) for x in r["output_len"]],
            "output_text": r["output_text"].tolist() if "output_text" in r else None}


def _load(w, n, seed, tok, max_prompt_tokens, upto):
    """``n`` requests of ``w`` (``upto``: at most ``n``, all of a smaller workload, in the same seeded order)."""
    from . import workloads as wl

    kw = dict(seed=seed, tokenizer=tok, max_prompt_tokens=max_prompt_tokens)
    return wl.load_upto(w, n, **kw) if upto else wl.load(w, n=n, **kw)


def _decoded_path(part: Path) -> Path:
    return part.with_name(part.name.replace(".jsonl", ".decoded.jsonl"))


def _read_decoded(path: Path, settings: dict) -> dict:
    """{request id: (output ids, decode seconds)} of a decoded-outputs file started with ``settings`` (else {});
    a last line cut by a kill is ignored."""
    if not path.exists():
        return {}
    out, lines = {}, path.read_bytes().split(b"\n")
    try:
        head = json.loads(lines[0])
    except ValueError:
        return {}
    if head.get("settings") != _norm_settings(settings):
        return {}
    for raw in lines[1:]:
        try:
            rec = json.loads(raw)
            out[str(rec["id"])] = ([int(x) for x in rec["output"]], float(rec["s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _vllm_decode(model, workloads, target, tok, *, out, n, seed, max_prompt_tokens, max_new_tokens, settings_of, compare,
                 quiet, upto=False, compare_workload=None):
    """vLLM's greedy outputs for every request of ``workloads`` (one engine start), kept in a decoded-outputs file
    beside each partial file; returns ({workload: {request id: (output, seconds)}}, decode stats)."""
    from . import models
    from .engines.torch import eos_ids_of, generate
    from .engines.vllm.decode import vllm_greedy

    eos = sorted(eos_ids_of(target, tok))
    reqs = {w: _load(w, n, seed, tok, max_prompt_tokens, upto) for w in workloads}
    decoded = {w: _read_decoded(_decoded_path(partial_path(out, model, w)), settings_of(w)) for w in workloads}
    todo = [(w, r) for w in workloads for r in reqs[w] if str(r.id) not in decoded[w]]
    stats: dict = {"decoded_before_resume": sum(map(len, decoded.values()))}
    cw = compare_workload or (workloads[0] if workloads else None)
    cmp_prompts = [list(r.prompt_token_ids) for r in (reqs[cw] if cw in reqs else
                                                      _load(cw, n, seed, tok, max_prompt_tokens, upto))[:compare]] \
        if compare and cw else []
    if todo or cmp_prompts:
        path = models.converted_dir(model) if model in models.names() else model
        todo_prompts = [list(r.prompt_token_ids) for _, r in todo]
        cmp_new = min(256, max_new_tokens)
        marker = _comparison_path(out)
        if cmp_prompts:   # the torch engine first, alone on the GPU (vLLM has not started)
            t1 = time.perf_counter()
            res = generate(target, cmp_prompts, max_new_tokens=cmp_new, eos_token_ids=eos)
            wall = time.perf_counter() - t1
            torch_outs = res.output_ids
            nt = sum(map(len, res.output_ids))
            stats["engine_comparison"] = {
                "requests": len(cmp_prompts), "workload": cw, "max_new_tokens": cmp_new,
                "torch_output_tokens_per_s": round(nt / wall, 1), "torch_output_tokens": nt,
                "torch_batch_size": len(cmp_prompts), "torch_dtype": str(target.dtype),
                "note": "same requests, each engine alone on the GPU, all submitted at once (torch: one batch)"}

        def compared(extras):
            vouts, cst = extras[0]
            c = stats["engine_comparison"]
            c.update(vllm_output_tokens_per_s=cst["output_tokens_per_s"], vllm_output_tokens=cst["output_tokens"],
                     identical_outputs=sum(list(a) == list(b) for a, b in zip(vouts, torch_outs)),
                     speedup_vllm_over_torch=round(cst["output_tokens_per_s"] / c["torch_output_tokens_per_s"], 2)
                     if cst["output_tokens_per_s"] and c["torch_output_tokens_per_s"] else None)
            from .io import atomic_write

            marker.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(marker) as f:
                f.write(json.dumps(c) + "\n")
            if not quiet:
                print(f"[collect] decode throughput on {len(cmp_prompts)} {cw} requests: vLLM "
                      f"{c['vllm_output_tokens_per_s']} tok/s, torch engine {c['torch_output_tokens_per_s']} tok/s")

        outs, st = vllm_greedy(str(path), todo_prompts, max_new_tokens=max_new_tokens, eos_token_ids=eos,
                               extra=[(cmp_prompts, cmp_new)] if cmp_prompts else (), progress=not quiet,
                               on_extra_done=compared if cmp_prompts else None)
        stats.update({k: v for k, v in st.items() if k != "extra"})
        share = st["decode_wall_s"] / max(len(todo_prompts), 1)
        for w in workloads:
            new = [(r, o) for (w2, r), o in zip(todo, outs) if w2 == w]
            if not new:
                continue
            p = _decoded_path(partial_path(out, model, w))
            p.parent.mkdir(parents=True, exist_ok=True)
            fresh = not decoded[w]
            with open(p, "w" if fresh else "a") as f:
                if fresh:
                    f.write(json.dumps({"spec_repro_decoded": 1, "settings": _norm_settings(settings_of(w))}) + "\n")
                for r, o in new:
                    f.write(json.dumps({"id": str(r.id), "output": o, "s": share}) + "\n")
                    decoded[w][str(r.id)] = (o, share)
                f.flush()
                os.fsync(f.fileno())
    elif workloads and (earlier := _comparison_of_earlier_run(out)) is not None:
        stats["engine_comparison"] = earlier
    return decoded, stats


def _comparison_path(out) -> Path:
    """Where a run keeps its engine comparison until it finishes: beside the partial files."""
    return Path(out) / ".partial" / "engine_comparison.json"


def _comparison_of_earlier_run(out) -> dict | None:
    """The engine comparison of an interrupted run (kept beside the partial files), if any."""
    try:
        return json.loads(_comparison_path(out).read_text())
    except (OSError, ValueError):
        return None


def _trace_name(proposer: str) -> str:
    key = proposer.lower().replace("_", "-")
    return {"n-gram": "ngram", "prompt-lookup": "ngram", "draft-model": "draft", "earlyexit": "early-exit",
            "self-spec": "early-exit", "layerskip": "early-exit", "eagle1": "eagle", "eagle-1": "eagle",
            "eagle-3": "eagle3"}.get(key, key)


def add_proposers(path: str | Path, proposers: dict, *, settings: dict | None = None, provenance: dict | None = None,
                  quiet: bool = False, replace: bool = False) -> Path:
    """Add proposers to an existing trace from its stored token ids: n-gram by lookup, model-based proposers by
    one teacher-forced pass each (exact, as in the profiler; no new decode). ``replace``: a proposer the trace
    already holds is profiled again and its rows replaced (else refused). Rewrites the file atomically and
    updates its manifest entry."""
    import numpy as np
    import pandas as pd
    from .progress import tqdm

    from .profiler import proposer_profile
    from .traces import CONF_COLUMN, Trace, _conf_from_blocks, _conf_series

    from .provenance import check_manifest

    path = Path(path)
    man_path = path.parent / "MANIFEST.json"
    old = check_manifest(man_path).get(path.name, {})  # a damaged manifest is found now, not after the work
    t = read_trace(path)
    k_max = int(t.acc.k_max.iloc[0])
    if "output_token_ids" not in t.requests.columns:
        raise ValueError(f"{path}: the trace has no token ids, proposers cannot be added")
    again = sorted(set(proposers) & set(t.proposers))
    if again and not replace:
        raise ValueError(f"{path} already holds {', '.join(again)}; profile it again with --reprofile")
    rows, blocks = [], []
    for r in tqdm(list(t.requests.itertuples()), desc=f"add {sorted(proposers)} to {path.name}", disable=quiet):
        prompt, o = [int(x) for x in r.prompt_token_ids], [int(x) for x in r.output_token_ids]
        for name, p in proposers.items():
            acc, dl, conf = proposer_profile(p, prompt, o, k_max)
            L = int(r.output_len)
            rows.append(pd.DataFrame({
                "request_id": r.request_id, "dataset": r.dataset, "model": r.model, "proposer": name,
                "position": np.arange(L), "acc_len": acc[:L], "k_max": k_max,
                "draft_len": pd.array(dl[:L], dtype="Int16"), "prompt_len": int(r.prompt_len), "output_len": L}))
            blocks.append((L, None if conf is None else conf[:L]))
    meta = dict(t.meta)
    meta.setdefault("proposers", {}).update(settings or {})
    kept = t.acc[~t.acc.proposer.isin(list(proposers))]
    added = pd.concat(rows, ignore_index=True)
    if any(cf is not None for _, cf in blocks):
        added[CONF_COLUMN] = _conf_series(_conf_from_blocks(blocks), added.index)
    new = Trace(pd.concat([kept, added], ignore_index=True), t.requests, meta)
    new.to_parquet(path)
    keep = {k: v for k, v in old.items() if k not in ("date", "machine", "versions", "command")}
    keep.setdefault("proposers", {}).update(settings or {})
    keep["mean_acc_len"] = {p: round(float(new.acc[new.acc.proposer == p].acc_len.mean()), 3)
                            for p in new.proposers}
    keep.pop("confidence", None)
    keep.update(_confidence_entry(new))
    if provenance:
        keep.update({f"draft_{k}": v for k, v in provenance.items()})
    keep["sha256"] = sha256_file(path)   # the bytes just written: what readers check the file against
    keep["original_run"] = old.get("original_run") or {k: old.get(k) for k in ("date", "machine", "command")}
    # proposers the trace did not hold before; those it held and profiled again are listed under "reprofiled"
    keep["added_proposers"] = sorted(set(keep.get("added_proposers") or []) | (set(proposers) - set(again)))
    if again:
        import datetime as _dt

        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        where = f"{now} on {machine_name()}"          # each proposer's last profile: when and where
        keep["reprofiled"] = {**(keep.get("reprofiled") or {}), **{a: where for a in again}}
    record(man_path, path.name, **keep)
    if not quiet:
        print(f"[collect] added {sorted(proposers)} to {path} (mean acc_len {keep['mean_acc_len']})")
    return path


def _confidence_entry(trace) -> dict:
    """The manifest's note of which proposers carry the drafter's confidence ({} when none does)."""
    props = trace.confidence_proposers
    if not props:
        return {}
    return {"confidence": {"proposers": props, "shape": "[output positions, k_max] per request",
                           "storage": "uint8 code = round(254 p), 255 = none (steps of 1/254)",
                           "meaning": "probability of the drafter's own top-1 token at draft position d = 1..k_max "
                                      "(softmax of its logits), teacher-forced; Trace.confidence"}}


def _proposer_settings(p, draft_model) -> dict:
    if p.name == "ngram":
        return {"min_n": p.min_n, "max_n": p.max_n, "semantics": "vLLM prompt lookup (earliest longest match)"}
    if p.name == "early-exit":
        return {"layers": p.layers, "note": "self-draft from the target's first layers + final norm + LM head "
                                             "(LayerSkip-style stand-in for EAGLE, untrained)"}
    if p.name in ("eagle", "eagle3"):
        return _eagle_settings(p)
    return {"draft_model": draft_model}


def _eagle_settings(p) -> dict:
    """An EAGLE head's identity: its checkpoint's sha256 and, for a head trained here, its training record."""
    src = getattr(p.head, "source", None)
    out = {"kind": p.head.kind, "feature_layers": p.features, "head": str(src) if src else None,
           "note": "trained EAGLE-class head, chained greedy drafting as vLLM 0.25 (spec_repro.proposers.eagle)"}
    if src:
        out["head_sha256"] = head_identity(src)
        tr = Path(src) / "TRAINING.json"
        if tr.exists():
            rec = json.loads(tr.read_text())
            out["training"] = {"settings": rec.get("settings"), "held_out": rec.get("final_held_out_tokens_per_step"),
                               "data": rec.get("data")}
    return out


def engine_step_timings(model: str = "smollm2-135m", workload: str = "code-edit", *, n: int = 4,
                        max_new_tokens: int = 64, methods: Sequence[str] = ("none", "ngram", "early-exit"),
                        batch_sizes: Sequence[int] = (1, 4), k: int = 3, seed: int = 0, device: str = "cpu",
                        quiet: bool = False, draft_model: str | None = None, eagle_head: str | None = None):
    """Measured per-step phase timings of the reference engine (``STEP_COLUMNS`` + ``phase``), for the
    verification-bottleneck analysis on this machine. As in the study, a batch of B is ONE prompt copied B
    times; each of the ``n`` prompts runs once per (method, batch size), methods interleaved. Methods ``draft``
    and ``eagle`` need ``draft_model`` / ``eagle_head``."""
    import pandas as pd
    from .progress import tqdm

    from . import models
    from . import workloads as wl
    from .engines.torch import generate
    from .proposers import make_proposer

    target, tok = models.load(model, device=device)
    opts = {"draft_model": models.load(draft_model, device=device)[0] if draft_model else None}
    if eagle_head:
        from .proposers.eagle import load_head

        opts["eagle_head"] = load_head(eagle_head, target)
    reqs = wl.load(workload, n=n, seed=seed, tokenizer=tok)
    frames = []
    # interleaved (prompt-major), so that background load drifting over time hits every method alike
    combos = [(m, b, r) for r in reqs for b in batch_sizes for m in methods]
    for m, b, r in tqdm(combos, desc="engine steps", disable=quiet):
        prop = None if m == "none" else make_proposer(m, target, **opts)
        res = generate(target, [r.prompt_token_ids] * b, max_new_tokens=max_new_tokens, proposer=prop, k=k,
                       model_name=model)
        df = res.steps.drop(columns=["accepted_per_req"])
        df["request_id"], df["dataset"] = str(r.id), workload
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
