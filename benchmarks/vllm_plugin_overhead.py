"""Cost of spec_repro's vLLM step timer: output tokens/s with the plugin recording vs vLLM's own methods, in ONE
engine, runs interleaved (needs a CUDA GPU and vLLM 0.25.x). Prints the overhead per batch size measured in
this run. The H200 numbers committed in data/gpu/overhead.csv came from the same code (job ``overhead2``).

    python benchmarks/vllm_plugin_overhead.py [--model DIR_WITH_CONFIG_JSON] [--repeats 4] [--max-tokens 512]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from spec_repro.engines.vllm import VLLMEngineError, overhead_table
from spec_repro.engines.vllm_jobs import LLAMA8B, run_spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=LLAMA8B, help="a dir with config.json (dummy weights)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=512)
    a = ap.parse_args()
    vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
    spec = {"name": "overhead-bench", "config": dict(model=a.model, method="none", load_format="dummy",
                                                      max_num_seqs=max(a.batch_sizes), name=Path(a.model).name),
            "tasks": [{"type": "overhead", "batch_sizes": a.batch_sizes, "repeats": a.repeats, "prompt_len": 512,
                       "max_tokens": a.max_tokens, "vocab_size": vocab}]}
    with tempfile.TemporaryDirectory() as d:
        try:
            run_spec(spec, Path(d))
        except VLLMEngineError as e:
            sys.exit(f"vllm_plugin_overhead: {e}")
        runs = pd.DataFrame([r for r in map(json.loads, open(Path(d) / "results.jsonl")) if r["kind"] == "run"])
    runs["session"] = "this run"
    t = overhead_table(runs)
    for _, r in t.iterrows():
        print(f"B={r.batch_size}: off {r.off_median:.0f} tok/s, on {r.on_median:.0f} tok/s -> overhead "
              f"{100 * r.overhead_median:.1f}% (median of {r.repeats}), {100 * r.overhead_mean:.1f}% (mean)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
