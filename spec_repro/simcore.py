"""What the simulator (:mod:`spec_repro.simulate`) and the policies (:mod:`spec_repro.adaptive`,
:mod:`spec_repro.baselines`) share, below all of them: the error type, proposer names, one (dataset, model)
group's arrays, the drafter-kind codes and n-gram's match at every position recomputed from token ids.

n-gram's match from token ids, and the two alignments
-----------------------------------------------------
A trace's ``acc_len[j]`` of n-gram is the acceptance of ONE lookup; which context that lookup read depends on who
wrote the trace:

- ``study`` (the study's published ``combined_*.jsonl``): the draft made from prompt + output[:j], scored against
  output[j], output[j+1], ... (vLLM's prompt lookup, min 3 / max 7, recomputed from the ids reproduces 99.96% of
  the published InstructCoder values this way, 42% one position later);
- ``package`` (this package's profiler): the draft made from prompt + output[:j+1], scored against output[j+1], ...
  (its recorded ``draft_len`` is exactly that lookup's length).

``ngram_match`` recomputes the lookup at every position in both alignments, scores each against the output and
keeps the one that reproduces the trace's own n-gram acc_len (``NGRAM_AGREEMENT`` of the scorable positions at
least); where neither does (e.g. synthetic fixtures with random ids), it says so and returns no lengths. Reading
the match one position late (the package's alignment on the study's files) lets a policy see the very token the
step verifies: a look-ahead.
"""
from __future__ import annotations

import functools
import hashlib
import re
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from .traces import TraceError

__all__ = ["SimulationError", "is_ngram", "Requests", "group_arrays", "KIND_CODE", "NgramMatch", "ngram_match",
           "NGRAM_AGREEMENT", "walk", "walk_compiled",
           "catch_up_charges"]

KIND_CODE = {"linear": 0, "fraction": 1, "per_token": 2}
#: share of scorable positions at which the recomputed lookup must reproduce the trace's n-gram acc_len
NGRAM_AGREEMENT = 0.95
# content digest -> NgramMatch: the grids ask for one group's match many times, and every process of a CLI
# grid asks again (kept on disk too: _match_load / _match_store)
_MATCH_CACHE: dict = {}


class SimulationError(ValueError):
    """Bad simulation request (policy, accounting, batch size, ...); the message says what is allowed."""


def norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def is_ngram(proposer: str) -> bool:
    return norm_name(proposer).startswith("ngram")


@dataclass
class Requests:
    """The requests of one (dataset, model) group, concatenated: position j of request r is at off[r] + j."""

    ids: list
    P: np.ndarray      # prompt lengths (n,)
    L: np.ndarray      # output lengths (n,)
    off: np.ndarray    # (n + 1,) offsets into the position arrays
    acc: np.ndarray    # (Q, total) acc_len per proposer
    dlen: np.ndarray   # (Q, total) draft_len, -1 = unknown


def group_arrays(acc: pd.DataFrame, requests: pd.DataFrame, proposers: Sequence[str], order: list) -> Requests:
    """Concatenate the arrays of the requests in ``order``; L = the shortest of a request's proposer arrays."""
    n = len(order)
    rank = pd.Series(np.arange(n), index=pd.Index(order, dtype=object))
    # each row's rank in `order` (-1: not asked for), looked up once per distinct request id
    codes, uniq = pd.factorize(acc["request_id"])
    r_uniq = rank.reindex(pd.Index(uniq, dtype=object)).to_numpy(np.float64)
    r_all = np.append(np.nan_to_num(r_uniq, nan=-1), -1).astype(np.int64)[codes]
    asked = r_all >= 0
    pos_all = acc["position"].to_numpy(np.int64)
    acc_all = acc["acc_len"].to_numpy(np.int64)
    dl_all = acc["draft_len"].to_numpy(dtype="float64", na_value=np.nan)
    per = []
    for q in proposers:
        m = asked & (acc["proposer"] == q).to_numpy(dtype=np.bool_, na_value=False)
        r, pos = r_all[m], pos_all[m]
        if len(r) > 1 and not ((r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & (pos[1:] > pos[:-1]))).all():
            o = np.lexsort((pos, r))   # rows not already in (request, position) order
        else:
            o = np.arange(len(r))
        r, pos = r[o], pos[o]
        Lq = np.bincount(r, minlength=n)
        start = np.zeros(n + 1, np.int64)
        np.cumsum(Lq, out=start[1:])
        if not np.array_equal(pos, np.arange(len(pos)) - np.repeat(start[:-1], Lq)):
            raise TraceError(f"proposer {q!r}: acceptance positions must run 0..L-1 without gaps or repeats")
        per.append((start, acc_all[m][o], dl_all[m][o], Lq))
    L = np.min([x[3] for x in per], axis=0)
    if (L == 0).any():
        raise TraceError(f"request {order[int(np.flatnonzero(L == 0)[0])]!r} has no positions for {list(proposers)}")
    off = np.zeros(n + 1, np.int64)
    np.cumsum(L, out=off[1:])
    rr = np.repeat(np.arange(n), L)
    j = np.arange(off[-1]) - off[:-1][rr]
    a = np.stack([x[1][x[0][rr] + j] for x in per])
    dl = np.stack([np.nan_to_num(x[2][x[0][rr] + j], nan=-1) for x in per]).astype(np.int64)
    P = requests.drop_duplicates("request_id").set_index("request_id")["prompt_len"]
    return Requests(ids=list(order), P=P.loc[order].to_numpy(np.int64), L=L.astype(np.int64), off=off,
                    acc=a, dlen=dl)


# ---- the step walk (one request's path through its positions) --------------------------------------------------
def _walk_py(a, prop, off, oracle):
    """``walk`` as one pass over the requests' steps (compiled by numba in ``walk_compiled``)."""
    n = len(off) - 1
    total = off[n]
    req = np.empty(total, np.int64)
    pb = np.empty(total, np.int64)
    idx = np.empty(total, np.int64)
    inp = np.empty(total, np.int64)
    gen = np.empty(total, np.int64)
    s = 0
    for r in range(n):
        L = off[r + 1] - off[r]
        p = 1
        while p < L:
            j = off[r] + p - 1
            i = a[j] if oracle else prop[j] + 1
            g = min(a[j], i)
            req[s] = r
            pb[s] = p
            idx[s] = j
            inp[s] = i
            gen[s] = g
            s += 1
            p += g
    return req[:s], pb[:s], idx[:s], inp[:s], gen[:s]


@functools.lru_cache(maxsize=None)
def _walk_kernel():
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency
        return _walk_py
    return njit(cache=True)(_walk_py)


def walk_compiled(a, prop, off, oracle):
    """``walk``, compiled (numba): the same steps, for callers that run many walks."""
    a = np.ascontiguousarray(a, np.int64)
    prop = np.ascontiguousarray(prop if len(prop) else np.zeros(len(a)), np.int64)
    return _walk_kernel()(a, prop, np.ascontiguousarray(off, np.int64), bool(oracle))


def walk(a, prop, off, oracle):
    """For every request: the positions it visits. Returns per step, ordered by request then step: request,
    p before the step, array index (off[r] + p - 1), input length i and tokens produced g.

    All requests walk in lockstep (one numpy pass per step number), so the loop runs as many times as the
    longest request has steps, not once per step; no compiler needed. Where numba is loaded already (the
    policies use it), or a request is so long (over ``_LOCKSTEP_MAX_L`` positions) or the trace so large (over
    ``_LOCKSTEP_MAX_TOTAL``) that the lockstep passes would cost more than loading the compiled kernel (0.5 to
    1 s in a fresh process; the lockstep walk of a published file's 210,850 positions takes ~10 ms), the
    compiled one-pass walk gives the same steps."""
    longest = int(np.diff(off).max(initial=0))
    if "numba" in sys.modules or int(off[-1]) > _LOCKSTEP_MAX_TOTAL or longest > _LOCKSTEP_MAX_L:
        return walk_compiled(a, prop, off, oracle)
    return walk_lockstep(a, prop, off, oracle)


_LOCKSTEP_TAIL = 16               # fewer requests still walking: a numpy pass per step costs more than Python
_LOCKSTEP_MAX_L = 20_000          # lockstep passes (~20-40 us each): at most the longest request's positions
_LOCKSTEP_MAX_TOTAL = 20_000_000  # their numpy work: the trace's positions


def walk_lockstep(a, prop, off, oracle):
    """``walk`` in lockstep numpy (no compiler)."""
    off = np.asarray(off, np.int64)
    L = np.diff(off)
    r = np.flatnonzero(L > 1)
    p = np.ones(len(r), np.int64)
    parts = []
    while len(r) > _LOCKSTEP_TAIL:
        j = off[r] + p - 1
        aj = a[j]
        i = aj if oracle else prop[j] + 1
        g = np.minimum(aj, i)
        parts.append((r, p, j, i, g))
        p = p + g
        keep = p < L[r]
        r, p = r[keep], p[keep]
    # the few requests still walking (the longest): step by step, cheaper than a numpy pass per step
    for rq, p0 in zip(r.tolist(), p.tolist()):
        lo, n = int(off[rq]), int(L[rq])
        a_r = a[lo:lo + n].tolist()
        prop_r = a_r if oracle else prop[lo:lo + n].tolist()
        steps = []
        while p0 < n:
            aj = a_r[p0 - 1]
            i = aj if oracle else prop_r[p0 - 1] + 1
            g = min(aj, i)
            steps.append((p0, lo + p0 - 1, i, g))
            p0 += g
        s = np.array(steps, np.int64).reshape(-1, 4)
        parts.append((np.full(len(s), rq, np.int64), s[:, 0], s[:, 1], s[:, 2], s[:, 3]))
    if not parts:
        e = np.zeros(0, np.int64)
        return e, e, e, e, e
    req, p_before, idx, inp, gen = (np.concatenate(x).astype(np.int64) for x in zip(*parts))
    order = np.argsort(req, kind="stable")  # steps were appended in step order: stable keeps it per request
    return req[order], p_before[order], idx[order], inp[order], gen[order]


def catch_up_charges(req: np.ndarray, charges: list) -> list:
    """(Charges: [(Drafter, active mask or None, proposal, always)], per step ordered by request then step.) The
    charges plus, per drafter with ``catch_up`` > 0 that skips steps (an active mask), one more charge: its
    draft forward(s) at each re-entry (it runs at a step of a request, not at that request's previous step)."""
    from .costmodel import Drafter

    out = list(charges)
    if not len(req):
        return out
    first = np.r_[True, req[1:] != req[:-1]]
    for dr, active, _prop, _alw in charges:
        if active is None or not dr.catch_up:
            continue
        prev = np.r_[False, active[:-1]]
        reentry = active & ~prev & ~first
        if not reentry.any():
            continue
        if dr.kind == "per_token":
            fwd = Drafter("per_token", dr.c_kv, dr.c_tok, dr.c0)
            out.append((fwd, reentry, np.full(len(req), max(int(round(dr.catch_up)), 1), np.int64), False))
        else:
            out.append((Drafter(dr.kind, dr.c_kv, dr.c_tok, dr.c0, dr.fraction), reentry,
                        np.ones(len(req), np.int64), True))
    return out


# ---- n-gram's match from the token ids ----------------------------------------------------------------------
@dataclass
class NgramMatch:
    """n-gram's proposal length at every position of a group (``lens``, None where it cannot be recomputed),
    the alignment that reproduced the trace (``study`` / ``package`` / ``recorded`` for a recorded draft_len) and
    the share of scorable positions where the recomputed acceptance equals the trace's, per alignment."""

    lens: np.ndarray | None
    alignment: str
    agreement: dict
    why: str = ""


def _score(G, S, P, T, r, j, start, length, shift, kmax):
    """Acceptance (accepted + 1) of each lookup draft against the output and whether it is fully scorable.
    Row x: request r[x], whose tokens are G[S[r]:S[r] + T[r]] with its output from P[r] on; its draft
    tokens[start:start + length] is scored against output[j + shift:]."""
    n_out = (T - P)[r]
    base, top = S[r], T[r] - 1
    out0 = base + P[r]
    out_hi = np.maximum(n_out - 1, 0)
    hits = np.zeros(len(r), np.int64)
    x = np.flatnonzero(length > 0)   # the rows whose draft still matches
    for t in range(kmax):   # hits: the draft's tokens that match, up to the first that does not
        tgt_pos = j[x] + shift + t
        tgt = np.minimum(out0[x] + np.clip(tgt_pos, 0, out_hi[x]), len(G) - 1)
        src = base[x] + np.clip(start[x] + t, 0, top[x])
        x = x[(t < length[x]) & (tgt_pos < n_out[x]) & (G[src] == G[tgt])]
        if not len(x):
            break
        hits[x] += 1
    # scorable: the draft ended (all its tokens matched, or one failed) before the output ran out
    scorable = (j + shift + np.minimum(hits + 1, length) <= n_out) & (start >= 0) | (length == 0)
    return 1 + hits, scorable


def ngram_match(reqs: Requests, requests: pd.DataFrame, q: int, kmax: int, min_n: int = 3,
                max_n: int = 7) -> NgramMatch:
    """n-gram's proposal length at every position of ``reqs`` (proposer row ``q``): the recorded draft_len
    where the trace has it, else recomputed from the prompt and output token ids in ``requests`` in the
    alignment that reproduces the trace's acc_len (see the module docstring). A recomputed match is kept by
    the content it was computed from (the acc_len row, the offsets, the token ids, the arguments and this
    code's sha256): in the process and on disk under ``$SPEC_REPRO_CACHE/ngram/`` (verified by its sha256 when
    read; off with ``SPEC_REPRO_TRACE_CACHE=0``), so the calls of a grid after the first read it instead of
    redoing the lookup."""
    dl = reqs.dlen[q]
    if (dl >= 0).all():
        return NgramMatch(np.minimum(dl, kmax).astype(np.int64), "recorded", {})
    by_id = requests.drop_duplicates("request_id").set_index("request_id")
    pcol = next((c for c in ("prompt_token_ids", "prompt_ids") if c in by_id.columns), None)
    ocol = next((c for c in ("output_token_ids", "output_ids") if c in by_id.columns), None)
    prompts = dict(zip(by_id.index, by_id[pcol])) if pcol else {}
    outputs = dict(zip(by_id.index, by_id[ocol])) if ocol else {}
    toks_all = []
    for rid in reqs.ids:
        pr, ou = prompts.get(rid), outputs.get(rid)
        if not isinstance(pr, (list, np.ndarray)) or not isinstance(ou, (list, np.ndarray)) or len(pr) == 0:
            return NgramMatch(None, "none", {}, f"request {rid!r} records no draft_len and lacks the prompt/output "
                                                f"token ids to recompute it")
        toks_all.append((np.asarray(pr, np.int64), np.asarray(ou, np.int64)))
    h = hashlib.sha256(repr((_code_digest(), int(kmax), int(min_n), int(max_n), int(q))).encode())
    lens_and_ids = (x for pr, ou in toks_all for x in (np.array([len(pr), len(ou)]), pr, ou))
    for arr in (reqs.acc[q], reqs.off, *lens_and_ids):
        h.update(np.ascontiguousarray(arr, np.int64).tobytes())
    key = h.hexdigest()
    if key in _MATCH_CACHE:
        return _MATCH_CACHE[key]
    out = _match_load(key)
    if out is not None:
        return _match_keep(key, out)
    from .proposers import ngram as lookup

    total = int(reqs.off[-1])
    P = np.array([len(pr) for pr, _ in toks_all], np.int64)
    T = P + np.array([len(ou) for _, ou in toks_all], np.int64)
    seqs = [np.concatenate([pr, ou]) for pr, ou in toks_all]
    G = np.concatenate(seqs)
    S = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum(T, out=S[1:])
    # contexts prompt + output[:i], i = 0 .. len(output): the study's position j reads i = j, the package's
    # i = j + 1
    drafts = lookup.ngram_lookup_batch(seqs, P - 1, kmax, min_n, max_n)
    st_all = np.concatenate([d[0] for d in drafts])
    ln_all = np.concatenate([d[1] for d in drafts])
    qoff = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum(T - P + 1, out=qoff[1:])
    lens, agree = {}, {}
    for align, shift in (("study", 0), ("package", 1)):
        # positions past the end of the published output cannot be recomputed: 0 there
        n = np.minimum(reqs.L, T - P + 1 - shift)
        r = np.repeat(np.arange(len(seqs)), n)
        j = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        st, ln = st_all[qoff[r] + shift + j], ln_all[qoff[r] + shift + j]
        lens[align] = np.zeros(total, np.int64)
        lens[align][reqs.off[r] + j] = ln
        hat, scorable = _score(G, S, P, T, r, j, st, ln, shift, kmax)
        same = np.minimum(hat, kmax + 1) == np.minimum(reqs.acc[q, reqs.off[r] + j], kmax + 1)
        agree[align] = [int(same[scorable].sum()), int(scorable.sum())]
    share = {k: (v[0] / v[1] if v[1] else float("nan")) for k, v in agree.items()}
    best = max(share, key=lambda k: (share[k] if np.isfinite(share[k]) else -1))
    if not share[best] >= NGRAM_AGREEMENT:
        out = NgramMatch(None, "none", share, f"the lookup recomputed from the token ids reproduces n-gram's acc_len "
                                               f"at only {share[best]:.1%} of positions (study alignment "
                                               f"{share['study']:.1%}, package {share['package']:.1%}): the ids do "
                                               f"not belong to these arrays")
    else:
        out = NgramMatch(lens[best], best, share)
    _match_store(key, out)
    return _match_keep(key, out)


def _match_keep(key: str, out: NgramMatch) -> NgramMatch:
    """Keep ``out`` in the process's cache (the 16 newest) and return it, its lengths read-only (shared)."""
    if out.lens is not None:
        out.lens.flags.writeable = False
    if len(_MATCH_CACHE) >= 16:
        _MATCH_CACHE.pop(next(iter(_MATCH_CACHE)))
    _MATCH_CACHE[key] = out
    return out


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """sha256 of the code that computes a match (this module and the n-gram lookup): part of every match's
    key, so that a cached match never outlives the code that made it."""
    from pathlib import Path

    h = hashlib.sha256()
    for f in (Path(__file__), Path(__file__).parent / "proposers" / "ngram.py"):
        h.update(f.read_bytes())
    return h.hexdigest()


def _match_file(key: str):
    """Where the match of content ``key`` is kept across processes (``$SPEC_REPRO_CACHE/ngram/``), or None
    when ``SPEC_REPRO_TRACE_CACHE=0`` turns the trace caches off."""
    import os

    if os.environ.get("SPEC_REPRO_TRACE_CACHE", "1") == "0":
        return None
    from .fetch import cache_root

    return cache_root() / "ngram" / f"{key[:40]}.npz"


def _match_load(key: str) -> NgramMatch | None:
    """The match kept on disk for ``key``, or None: no entry, an entry whose bytes no longer hash to the
    sha256 recorded beside it (``<entry>.sha256``), or one that cannot be read (then it is computed again and
    replaced)."""
    import json

    f = _match_file(key)
    if f is None or not f.is_file():
        return None
    from .fetch import verify_file

    seal = f.with_suffix(".sha256")
    try:
        if not verify_file(f, seal.read_text().strip() if seal.is_file() else None):
            return None
        with np.load(f, allow_pickle=False) as z:
            info = json.loads(str(z["info"]))
            if info.get("key") != key:
                return None
            lens = z["lens"].astype(np.int64) if info["has_lens"] else None
        return NgramMatch(lens, info["alignment"], info["agreement"], info["why"])
    except (OSError, ValueError, KeyError, TypeError, UnicodeError):
        return None


def _match_store(key: str, out: NgramMatch) -> None:
    """Keep ``out`` on disk for the next process (with its sha256 beside it); a read-only or full cache only
    costs the next process the lookup."""
    import json

    f = _match_file(key)
    if f is None:
        return
    from .fetch import sha256_file
    from .io import atomic_path, atomic_write

    info = {"key": key, "has_lens": out.lens is not None, "alignment": out.alignment,
            "agreement": out.agreement, "why": out.why}
    try:
        with atomic_path(f) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, lens=out.lens if out.lens is not None else np.zeros(0, np.int64),
                     info=np.array(json.dumps(info)))
        with atomic_write(f.with_suffix(".sha256")) as fh:
            fh.write(sha256_file(f) + "\n")
    except OSError:
        pass
