"""The study's own datasets, loaded with Hugging Face ``datasets`` when a hub is reachable (imported lazily:
``datasets`` is not a dependency of spec_repro). Offline, a clear error names the offline analogues."""
from __future__ import annotations

from ._base import WorkloadError, user_message

# name -> (hub path, config, split, record -> prompt text, id field or None, offline analogue)
DATASETS = {
    "cnn_dailymail": ("abisee/cnn_dailymail", "3.0.0", "test",
                      lambda r: f"Summarize the following news article.\n\n{r['article']}", "id", "sharegpt"),
    "sharegpt-hf": ("anon8231489123/ShareGPT_Vicuna_unfiltered", None, "train", None, "id", "sharegpt"),
    "instructcoder": ("likaixin/InstructCoder", None, "train",
                      lambda r: f"{r['instruction']}\n\n{r['input']}".strip(), None, "code-edit"),
    "gsm8k": ("openai/gsm8k", "main", "test", lambda r: r["question"], None, "gsm-symbolic"),
    "aime": ("AI-MO/aimo-validation-aime", None, "train", lambda r: r["problem"], "id", "champ"),
    "gpqa": ("Idavidrein/gpqa", "gpqa_main", "train",
             lambda r: r["Question"], "Record ID", "champ"),
}
_SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def _sharegpt_prompt(r):
    for t in r.get("conversations") or []:
        if t.get("from") in ("human", "user") and (t.get("value") or "").strip():
            return t["value"]
    return None


def records(name: str) -> list[dict]:
    path, config, split, prompt, id_field, offline = DATASETS[name]
    hint = (f"online workload {name!r} needs the Hugging Face dataset {path!r}"
            f"{f' (config {config!r})' if config else ''}. ")
    try:
        import datasets
    except ImportError:
        raise WorkloadError(hint + "`pip install datasets` and a reachable hub are required; offline, use "
                            f"the embedded analogue {offline!r} (all offline workloads: see "
                            "spec_repro.workloads.NAMES).") from None
    from ..models import _hub_reachable

    if not _hub_reachable():
        raise WorkloadError(hint + f"The hub is not reachable from here. Offline, use the embedded analogue "
                            f"{offline!r} (see spec_repro.workloads.NAMES).")
    try:
        if name == "sharegpt-hf":
            ds = datasets.load_dataset(path, data_files=_SHAREGPT_FILE, split=split)
        else:
            ds = datasets.load_dataset(path, config, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds when offline
        raise WorkloadError(hint + f"Loading failed: {e}. Offline, use the embedded analogue {offline!r} "
                            "(see spec_repro.workloads.NAMES).") from None
    out = []
    for i, r in enumerate(ds):
        text = _sharegpt_prompt(r) if prompt is None else prompt(r)
        if not text:
            continue
        rid = r.get(id_field) if id_field else None
        out.append({"id": f"{name}/{rid if rid is not None else i}", "messages": user_message(text),
                    "meta": {"source": path}})
    return out
