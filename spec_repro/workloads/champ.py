"""CHAMP (Mao, Kim, Zhou 2024: 270 competition-level math problems, MIT) from the wheel ``champ-dataset``:
the package's AIME analogue. The prompt is CHAMP's own zero-shot problem prompt."""
from __future__ import annotations

import json

from ._base import WheelSource, user_message

MEMBER = "champ_dataset/dataset_files/v0.json"
SOURCE = WheelSource(
    requirement="champ-dataset==1.0.0",
    sha256="aa59df5ae28e2ec76a401a46faf3d6395920be8009a01ce451f7d5c131d82201",
    license="MIT",
    homepage="https://yujunmao1.github.io/CHAMP/",
    members=(MEMBER,),
)
# champ_dataset/prompt.py: prompt_main (its system prompt 'You are an expert on mathematics.' is not used so
# that every model's own default system prompt applies, as for the other workloads)
PROMPT = "Solve the following problem. Make sure to show your work before giving the final answer.\n\n{text}"


def build(data: dict[str, bytes]):
    probs = json.loads(data[MEMBER])["problems"]
    records = [{"id": f"champ/{k}", "messages": user_message(PROMPT.format(text=p["_text"])),
                "meta": {"category": p["category"], "answer": p["_answer"]}} for k, p in probs.items()]
    return records, {}
