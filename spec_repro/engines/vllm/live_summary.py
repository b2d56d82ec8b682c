"""A live run's raw device folder -> a folder of compact files (``FILE_DOCS``; ``data/gpu/live`` by default) and
their MANIFEST.json, written into a stage folder and swapped in whole (``summarize``)."""
from __future__ import annotations

import json
from pathlib import Path

from ...io import write_via
from .labels import run_labels
from .live_runs import ENGINE_NOTES, OUT, latest, load
from .live_tables import TABLES, _write_table, device_trace, measured_vs_predicted, table_args

FILE_DOCS = {
    "runs.csv": "one row per timed run (engine spec, engine_config, method, hybrid policy, batch size, repeat, "
                "tok/s, wall s, vLLM's spec-decode counters, weights; what ran: runner (v1/v2) beside runner_forced, "
                "async_scheduling beside async_scheduling_forced, instrumented, runner_source: labels module)",
    "steps.parquet": "every step the plugin timed (STEP_COLUMNS + spec, engine_config, uniform, hybrid counts), "
                     "per-request detail left out",
    "lossless.csv": "per hybrid-task run: requests whose greedy output equals no SD's at the same batch size",
    "qwen_agreement.json": "vLLM's accepted tokens per step vs the profiler's prediction on vLLM's own outputs "
                           "(EAGLE head, n-gram, 0.5B draft model)",
    "hybrid_trace.jsonl": "the hybrid task's code-edit requests profiled on no SD's outputs (n-gram, EAGLE head; "
                          "torch float32 on the CPU, `live profile`): the predictor's input",
    "predicted.csv": "measured tok/s of each live configuration beside three predictions over hybrid_trace.jsonl "
                     "(cost models fitted on the same run's steps; measured_vs_predicted)",
    "hybrid_trace_s4.jsonl": "the same 64 requests' committed no-SD outputs (data/gpu/v1-runner/agreement) "
                             "profiled with the head trained in the engine-per-policy study's run (sha256 2dce8ecc, "
                             "2026-12-02; n-gram, EAGLE; bf16 on the H200, `live profile --device cuda`)",
    "hybrid_trace_s5.jsonl": "the same, profiled with the head trained in the rotated-code-edit study's run (sha256 "
                             "cae15564, 2026-12-02; bf16 on the H200)",
    "hybrid_trace_s9.jsonl": "this run's code-edit no-SD outputs (bs 64) profiled with the head ff44a72f "
                             "(trained in the rotated-sharegpt study's run; n-gram, EAGLE; bf16 on the H200)",
    "host.txt": "the H200 host during the run: lscpu, CPU clocks, the GPU's clocks and performance state",
    "device_hybrid.csv": "the device-side hybrid's comparison per batch size: each configuration's tok/s over the "
                         "best single proposer and over EAGLE, its prediction, measured vs predicted decode steps "
                         "(device_hybrid_table)",
    "device_hybrid_sharegpt.csv": "the same on sharegpt (device_hybrid_table(workload='sharegpt'))",
    "hybrid_trace_sharegpt_s8.jsonl": "this run's sharegpt no-SD outputs (its bs 64 run) profiled with the head "
                                      "ff44a72f trained in the same run (n-gram, EAGLE; torch float32 on the CPU, "
                                      "`live profile --device cpu`, after the run)",
    "hybrid_trace_sharegpt_s10.jsonl": "this run's sharegpt no-SD outputs (bs 64) profiled with the head ff44a72f "
                                       "(trained in the rotated-sharegpt study's run; n-gram, EAGLE), in the run's "
                                       "request order (the predictor walks the first B); the device is each "
                                       "record's `device`: in sharegpt-two-machines the CPU in float32, 61 of its 64 "
                                       "records from rotated-sharegpt's profile of equal outputs; in "
                                       "sharegpt-one-machine bf16 on the H200 (data/gpu/v1-runner/)",
    "hybrid_trace_s11.jsonl": "a run's code-edit no-SD outputs (bs 64) profiled with the head of the same run "
                              "(n-gram, EAGLE; bf16 on the H200)",
    "hybrid_trace_sharegpt_s11.jsonl": "this run's sharegpt no-SD outputs (bs 64) profiled with the head 38d37cbe "
                                       "trained in the same run (2026-12-04; n-gram, EAGLE; bf16 on the H200), in "
                                       "the run's request order",
    "head.sha256": "sha256 of the EAGLE head the run used: trained in it (`TRAIN=1 gpu/live_job.sh start`: "
                   "data/gpu/v1-runner's 2dce8ecc in engine-per-policy, cae15564 in rotated-code-edit, ff44a72f "
                   "in rotated-sharegpt, 38d37cbe in host-probe) or staged from the cache (ff44a72f in "
                   "adaptive-rule, sharegpt-two-machines, sharegpt-one-machine)",
    "head_TRAINING.json": "that head's training record (data, split by source, steps, held-out tokens/step)",
    "head_config.json": "that head's config.json",
}


def summarize(raw: str | Path, out: str | Path = OUT, command: str = "", *, inner=None) -> dict:
    """Write ``out``'s files (FILE_DOCS) from the raw folder; MANIFEST.json records each with its sha256. The files
    are written into a stage folder (``io.staged_dir``) and replace ``out``'s only once every one of them,
    MANIFEST.json included, was written: a failure leaves ``out`` as it was. The profiles already in ``out``
    (``hybrid_trace*.jsonl``: made by ``live profile`` or copied from the raw folder), which the predictions read,
    are read from copies in the stage; ``out``'s own stay as they are. ``out`` may not overlap the raw folder
    (``summary.check_raw_out``). ``inner(raw, stage, out, command)``: the writer (default: this module's; the V2
    job's summary passes its own through the same staging)."""
    from ...io import staged_dir
    from .summary import check_raw_out

    raw, out = Path(raw), Path(out)
    check_raw_out([raw], out)       # the raw folder is searched recursively: out may not overlap it
    inputs = sorted(p.name for p in out.glob("hybrid_trace*.jsonl") if p.is_file())
    with staged_dir(out, seed=("MANIFEST.json", *inputs)) as stage:
        res = (inner or _summarize)(raw, stage, out, command)
        for name in inputs:        # read in the stage, not written: out's own files stay (and any line appended)
            (stage / name).unlink()
        return res


def _summarize(raw: Path, out: Path, final: Path, command: str) -> dict:
    """``summarize`` writing into ``out`` (the stage) the files that will replace ``final``'s."""
    from .agreement import agreement_report

    runs, steps, engines = load(raw)
    write_runs_steps(runs, steps, out)
    agree = {}
    qres = sorted(raw.rglob("qwen*/results.jsonl"))             # every Qwen results folder: qwen, qwen2, ...
    write_lossless(qres, out)
    for f in qres:
        if any(json.loads(x).get("task") == "prompts" for x in open(f) if x.strip()):   # the agreement engines
            agree.update(agreement_report(f.parent))
    if agree:
        (out / "qwen_agreement.json").write_text(json.dumps(agree, indent=1, default=float) + "\n")
    if (out / "hybrid_trace.jsonl").exists():     # made on the CPU by `profile` (the predictor's input)
        write_via(measured_vs_predicted(out, out / "hybrid_trace.jsonl").to_csv, out / "predicted.csv", index=False,
                  float_format="%.6g")
    ta = table_args(out)
    for name, wl in TABLES.items():   # where a workload's profile is here (copied from the raw folder: the GPU's)
        if device_trace(out, wl) is not None:
            _write_table(out, name, wl, ta)
    write_manifest(raw, out, final, command, engines, FILE_DOCS)
    return {"runs": len(runs), "steps": len(steps), "engines": len(engines)}


def write_runs_steps(runs, steps, out: Path) -> None:
    """``runs.csv`` and ``steps.parquet`` (per-request detail left out). The tables read them back before the
    manifest is written, so a manifest seeded in the stage (a folder summarized again) gets their new sha256 now."""
    from ...provenance import sha256_file, update_entry

    write_via(runs.to_csv, out / "runs.csv", index=False)
    keep = [c for c in steps.columns if c not in ("accepted_per_req",)]
    write_via(steps[keep].to_parquet, out / "steps.parquet", compression="zstd", index=False)
    man = out / "MANIFEST.json"
    for name in ("runs.csv", "steps.parquet"):
        try:
            update_entry(man, name, sha256=sha256_file(out / name))
        except (KeyError, FileNotFoundError):   # no seeded manifest, or no entry: nothing recorded to mismatch
            pass


def write_lossless(results_files, out: Path) -> None:
    """``lossless.csv`` (``jobs.lossless_report`` of each results file on its own: a folder's runs against the
    no-SD engine of the same folder; a run measured again, its last measurement: ``live_runs.latest``), when any
    run was compared."""
    import pandas as pd

    from .jobs import lossless_report

    ll = []
    for f in results_files:
        ll += lossless_report(latest([json.loads(x) for x in open(f) if x.strip()]))
    if ll:
        ll = pd.DataFrame(ll)
        ll["first_difference"] = ll["first_difference"].map(lambda v: json.dumps(v) if v else "")
        write_via(ll.to_csv, out / "lossless.csv", index=False)


def write_manifest(raw: Path, out: Path, final: Path, command: str, engines: list[dict], file_docs: dict) -> None:
    """MANIFEST.json in the stage ``out``: ``_device_runs`` (where, when and how the raw folder's runs were made:
    device, versions, every engine's configuration and labels) and one entry per file of ``out`` and ``final``
    (the stage's win) with its ``file_docs`` description and sha256."""
    import datetime as dt

    from ...provenance import machine_info, package_versions, record, sha256_file

    env = engines[0].get("env", {}) if engines else {}
    when = max((f.stat().st_mtime for f in raw.rglob("results*.jsonl")), default=None)
    # where the numbers were measured (the device), not where this summary ran (summarized_on)
    dev = {"machine": {k: env.get(k) for k in ("gpu", "gpu_mem_gib", "cuda", "platform", "python")},
           "versions": {"vllm": engines[0].get("vllm") if engines else None, "torch": env.get("torch"),
                        "spec-repro": package_versions().get("spec-repro")},
           "summarized_on": {"machine": machine_info(), "versions": package_versions()}}
    if when is not None:
        dev["date"] = dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat(timespec="seconds")
    record(out / "MANIFEST.json", "_device_runs", kind="where and how the measurements were made", **dev,
           summarize_command=command, engine_configs=ENGINE_NOTES,
           engines=[{"spec": e["spec"], "engine_config": run_labels(e.get("config") or {}, e)["engine_config"],
                     "start_s": round(e["start_s"], 1), "instrumented": e.get("instrumented"),
                     **({"resolved": e["resolved"]} if e.get("resolved") else {}),
                     "config": {k: (Path(v).name if k in ("model", "draft", "step_log") and isinstance(v, str)
                                    else v) for k, v in e["config"].items() if v not in (None, {}, "")}}
                    for e in engines])
    files = {p.name: p for d in (final, out) for p in d.iterdir()   # the stage's (new) files win over final's
             if p.is_file() and not p.name.startswith(".")}          # not locks
    for name in sorted(files):
        if name in ("MANIFEST.json", "README.md"):
            continue
        cpu = name.startswith("hybrid_trace") and _profiled_on(files[name]) != "cuda"    # `live profile` here
        kind = ("computed on the CPU from the H200's no-SD outputs (torch float32)" if cpu else
                "measured on the lent H200 (see _device_runs), or computed from those measurements")
        record(out / "MANIFEST.json", name, file=name, description=file_docs.get(name, ""),
               sha256=sha256_file(files[name]), kind=kind, **({} if cpu else dev))


def _profiled_on(path: Path) -> str | None:
    """The device a ``live profile`` file was profiled on (its records' ``device``; None in files that predate it)."""
    with open(path) as f:
        first = f.readline()
    return json.loads(first).get("device") if first.strip() else None
