"""Cost of spec_repro's vLLM step timer: output tokens/s with the plugin recording vs vLLM's own methods, in ONE
engine, runs interleaved (needs a CUDA GPU and vLLM 0.25.x). Prints the overhead per batch size measured in
this run. The H200 numbers committed in data/gpu/overhead.csv came from the same code (jobs ``overhead2``,
``s3-gpu0``).

    python benchmarks/vllm_plugin_overhead.py [--model DIR_WITH_CONFIG_JSON] [--repeats 4] [--max-tokens 512]
    python benchmarks/vllm_plugin_overhead.py --host      # no GPU: the timers' host time per step (V1, V2)

``--host`` drives the recorder with stand-in events on SchedulerOutput-shaped batches and prints the host time
a step spends in the timer on its critical path (before the forward is launched and after the sampled tokens
are back: begin, 8 marks, end) and in the deferred part (rows built while the GPU runs the next forward), for
plugin v3 and with v2's placement of the batch-shape read, next to the H200's measured step times. CUDA event
records themselves (a few microseconds each) are not in it.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from spec_repro.engines.vllm import VLLMEngineError
from spec_repro.engines.vllm.steps import overhead_table
from spec_repro.engines.vllm.jobs import LLAMA8B, run_spec


class _Event:
    """A CUDA event's stand-in for the host-time measurements: records nothing, always complete."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = 0.0

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


def host_cost(batch_sizes=(1, 64), steps: int = 3000) -> None:
    import time
    import types

    from spec_repro.engines.vllm import plugin as vp

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Event, current_stream=lambda: "s"))
    gpu = Path(__file__).parents[1] / "data" / "gpu" / "phase_breakdown.csv"
    ms = {}
    if gpu.exists():
        pb = pd.read_csv(gpu)
        sel = pb[(pb.steps_kind == "decode") & (pb.model == "llama31-8b") & (pb.method == "none")]
        if "primary" in sel:
            sel = sel[sel.primary]
        ms = dict(zip(sel.batch_size, sel.total_ms))
    for b in batch_sizes:
        ids = [f"{i}-0a1b2c3d" for i in range(b)]
        so = types.SimpleNamespace(
            num_scheduled_tokens={r: 4 for r in ids}, scheduled_spec_decode_tokens={r: [1, 2, 3] for r in ids},
            scheduled_new_reqs=[], total_num_scheduled_tokens=4 * b,
            scheduled_cached_reqs=types.SimpleNamespace(req_ids=ids, num_computed_tokens=[600] * b,
                                                        num_output_tokens=[100] * b))
        out = types.SimpleNamespace(req_ids=ids, sampled_token_ids=[[1, 2]] * b)
        with tempfile.TemporaryDirectory() as d:
            rec = vp.StepRecorder(str(Path(d) / "s.jsonl"))
            rec._torch, rec._rank_ok = fake, True
            rec.set_context(run_id="bench", model="m", method="ngram", k=3, batch_size=b)
            crit = deferred = v2_meta = 0.0
            for _ in range(steps):
                t0 = time.perf_counter()
                rec.begin(None, so)
                for m in ("fwd0", "fwd1", "samp0", "samp1"):
                    rec.mark(m)
                t1 = time.perf_counter()
                rec.drain()                        # deferred: runs while the GPU computes the forward
                t2 = time.perf_counter()
                rec.mark("draft0")
                rec.mark("draft1")
                rec.end(out)
                t3 = time.perf_counter()
                vp.step_meta(so)                   # what v2 did inside begin()
                t4 = time.perf_counter()
                crit += (t1 - t0) + (t3 - t2)
                deferred += t2 - t1
                v2_meta += t4 - t3
            rec.flush()
        c, dfr, v2 = (1e6 * x / steps for x in (crit, deferred, v2_meta))
        line = (f"B={b}: critical path {c:.1f} us/step (v2 placement: {c + v2:.1f} us, {(c + v2) / c:.2f}x), "
                f"deferred {dfr:.1f} us/step")
        if b in ms:
            line += (f"; H200 step {ms[b]:.2f} ms -> {100 * c / 1e3 / ms[b]:.2f}% of a step on this CPU "
                     f"(v2 placement {100 * (c + v2) / 1e3 / ms[b]:.2f}%)")
        print(line)


def host_cost_v2(batch_sizes=(1, 8, 32, 64), steps: int = 3000) -> None:
    """The V2 timer as it runs (deferred: ``step_timer`` with ``defer``): its host time a step on the step's path
    (begin with the shape read, 6 marks, end, the async output's read) and per step at flush (rows built after
    the generate call, outside the run's timed window), with stand-in events, beside the H100's measured V2 no-SD
    decode step (data/gpu/live). CUDA event records are not in it (on a GPU each V2 row's ``t_timer`` has them)."""
    import time
    import types

    from spec_repro.engines.vllm import step_timer

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Event, current_stream=lambda: "s"))
    live = Path(__file__).parents[1] / "data" / "gpu" / "live" / "steps.parquet"
    ms = {}
    if live.exists():
        st = pd.read_parquet(live, columns=["config", "stage", "phase", "batch_size", "t_total"])
        st = st[(st["config"] == "none") & (st["stage"] == "grid") & (st["phase"] == "decode")]
        ms = (1e3 * st.groupby("batch_size")["t_total"].median()).to_dict()
    k = 5
    for b in batch_sizes:
        ids = [f"{i}-0a1b2c3d" for i in range(b)]
        so = types.SimpleNamespace(
            num_scheduled_tokens={r: 1 + k for r in ids}, scheduled_spec_decode_tokens={r: [-1] * k for r in ids},
            scheduled_new_reqs=[], total_num_scheduled_tokens=(1 + k) * b,
            scheduled_cached_reqs=types.SimpleNamespace(req_ids=ids, num_computed_tokens=[600] * b,
                                                        num_output_tokens=[100] * b))
        res = types.SimpleNamespace(req_ids=ids, sampled_token_ids=[[1, 2, 3]] * b)
        runner = types.SimpleNamespace(main_stream="s")
        with tempfile.TemporaryDirectory() as d:
            rec = step_timer.StepRecorder(str(Path(d) / "s.jsonl"))
            rec._torch, rec._rank_ok, rec.defer = fake, True, True
            rec.set_context(run_id="bench", model="m", method="eagle", k=k, batch_size=b)
            path = flush = 0.0
            for i in range(steps):
                t0 = time.perf_counter()
                rec.begin(runner, so)
                rec.mark("fwd0")
                rec.mark("fwd1", "samp0")
                rec.mark("samp1")
                rec.mark("draft0")
                rec.mark("draft1")
                out = types.SimpleNamespace(get_output=None)
                st = rec.cur
                rec.end(out)
                st.set_outputs(res)                 # the async output's read (AsyncOutput.get_output)
                path += time.perf_counter() - t0
                if i % 128 == 127:                  # a generate call of 128 steps ends: its rows are built
                    t1 = time.perf_counter()
                    rec.flush()
                    flush += time.perf_counter() - t1
        c, f = 1e6 * path / steps, 1e6 * flush / steps
        line = f"V2 B={b}: on the step's path {c:.1f} us/step, at flush {f:.1f} us/step"
        if b in ms:
            line += f"; H100 no-SD decode step {ms[b]:.2f} ms -> {100 * c / 1e3 / ms[b]:.2f}% of a step on this CPU"
        print(line)


def main() -> int:
    if "--host" in sys.argv[1:]:
        host_cost()
        host_cost_v2()
        return 0
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
