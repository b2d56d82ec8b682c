"""vLLM live on the H200 (``gpu/live_job.sh``) -> compact tables from the raw device folder (its ``results.jsonl``
and the plugin's ``steps_*.jsonl``; the raw step logs stay out of the repo). New tables go to ``data/gpu/live``
(``OUT``) unless ``--out`` says otherwise; the committed V1-runner (forced) studies are under
``data/gpu/v1-runner/`` (its README), and the readers default to its ``agreement`` study (``COMMITTED``).

What that study ran: vLLM 0.25.0 on one H200. Qwen2.5-Coder-1.5B-Instruct, real weights (the package's q4_k_m GGUF,
de-quantized, run in bf16), with the package's EAGLE head, n-gram and the 0.5B draft model: agreement prompts
and the live hybrid's task (code-edit, bs 1/8/32/64, k = 5, 3 repeats). Llama-3.1-8B dimensions, dummy weights:
no SD on vLLM's default engine (async scheduling, the runner vLLM picks, no plugin) and the study-like one
(synchronous V1 runner, plugin on), bs 1/16/64/256.

    python -m spec_repro.engines.vllm.live summarize --raw DIR [--out data/gpu/live]
    python -m spec_repro.engines.vllm.live profile --raw DIR [--out data/gpu/live/hybrid_trace.jsonl]
        # CPU, resumable (~20 s a request on 2 cores): the hybrid task's requests profiled on no SD's outputs
    python -m spec_repro.engines.vllm.live tables [--out data/gpu/v1-runner/agreement]   # the tables of a folder

This module is the command line; the work is in ``live_runs`` (the raw folder read back), ``live_summary`` (raw ->
a folder of tables, staged), ``live_throughput`` (the measured tables), ``live_profile`` (the hybrid task's
requests profiled), ``live_model`` (the step-cost fit and the walk that predicts) and ``live_tables`` (measured
against predicted); their names are importable from here too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .live_model import (FIT_CONFIGS, HOST_PHASES, K, LIVE_CONFIGS, _lin, _walk, fit_step_model,  # noqa: F401
                         host_index, predict, predict_runs, rule_steps)
from .live_profile import default_head, load_profiles, profile_hybrid_task  # noqa: F401
from .live_runs import (COMMITTED, ENGINE_NOTES, OUT, QWEN, TIMED, _cfg_fields, _config, load,  # noqa: F401
                        read_runs, step_configs)
from .live_summary import FILE_DOCS, _profiled_on, summarize  # noqa: F401
from .live_tables import (SINGLES, TABLES, _write_table, device_hybrid_table, device_trace,  # noqa: F401
                          measured_vs_predicted, paired_ratios, predicted_padded, retable, table_args)
from .live_throughput import DIMS, _dims, llama_baseline, step_floor_s, step_split, throughput  # noqa: F401

__all__ = ["FILE_DOCS", "ENGINE_NOTES", "TIMED", "read_runs", "step_configs", "load", "summarize", "throughput",
           "llama_baseline", "step_split", "profile_hybrid_task", "load_profiles", "host_index", "fit_step_model",
           "predict", "predict_runs", "measured_vs_predicted", "predicted_padded", "device_hybrid_table", "main"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.live", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--raw", required=True)
    s.add_argument("--out", default=str(OUT))
    pf = sub.add_parser("profile")
    pf.add_argument("--raw", help="a raw device folder (its no-SD outputs at bs 64)")
    pf.add_argument("--trace", help="or an earlier hybrid_trace.jsonl (its outputs)")
    pf.add_argument("--out", default=str(OUT / "hybrid_trace.jsonl"))
    pf.add_argument("--head")
    pf.add_argument("--device", default="cpu")
    pf.add_argument("--workload", default="code-edit", help="the hybrid task's workload (--raw: its no-SD run)")
    t = sub.add_parser("tables")
    t.add_argument("--out", default=str(COMMITTED), help="a summarized folder (default: the committed V1-runner "
                   "study, data/gpu/v1-runner/agreement)")
    rt = sub.add_parser("retable", help="recompute a folder's prediction tables from its committed measurements")
    rt.add_argument("--out", required=True)
    rt.add_argument("--why", required=True, help="what changed in the model (kept in the manifest)")
    a = ap.parse_args(argv)
    if a.cmd == "retable":
        if not (Path(a.out) / "runs.csv").is_file():
            print(f"live retable: no runs.csv in {a.out}", file=sys.stderr)
            return 2
        got = retable(a.out, a.why, " ".join(["python -m spec_repro.engines.vllm.live", *sys.argv[1:]]))
        print(f"{a.out}: " + (", ".join(got) + " recomputed" if got else "unchanged"))
        return 0
    if a.cmd == "summarize":
        if not Path(a.raw).is_dir():
            print(f"live summarize: no folder {a.raw}", file=sys.stderr)
            return 2
        from ...io import OutputError

        try:
            print(summarize(a.raw, a.out, command=" ".join(["python -m spec_repro.engines.vllm.live", *sys.argv[1:]])))
        except OutputError as e:          # --out overlapping --raw
            print(f"live summarize: {e}", file=sys.stderr)
            return 2
        return 0
    if a.cmd == "profile":
        if not (a.raw or a.trace):
            print("live profile: give --raw DIR or --trace FILE (the no-SD outputs to profile)", file=sys.stderr)
            return 2
        print(profile_hybrid_task(a.raw, a.out, a.head, trace=a.trace, device=a.device, workload=a.workload))
        return 0
    if not (Path(a.out) / "runs.csv").is_file():
        print(f"live tables: no runs.csv in {a.out}", file=sys.stderr)
        return 2
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        t = throughput(out=a.out)
        print(t.round(3).to_string(index=False))
        if (t["model"] == "llama31-8b").any():      # runs without Llama dims: no baseline
            print(llama_baseline(a.out).round(3).to_string(index=False))
        print(step_split(a.out).round(2).to_string(index=False))
        if (Path(a.out) / "hybrid_trace.jsonl").exists():
            print(measured_vs_predicted(a.out, Path(a.out) / "hybrid_trace.jsonl").round(3).to_string(index=False))
        if device_trace(a.out) is not None:                                 # the device-side hybrid's runs
            print(device_hybrid_table(a.out).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
