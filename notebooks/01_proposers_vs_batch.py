# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Finding 1: speculative decoding's speedup shrinks as the batch grows
#
# **Paper** (vLLM 0.10, H100): SD always helps but gains shrink with batch size. EAGLE reaches up to **1.96x** (Llama-3-70B, batch 1); Llama-3.1-8B on GSM8K drops to **1.21x** at batch 128; n-gram wins on InstructCoder.
#
# **This notebook**: (a) *simulated* speedup of each proposer vs batch size, from this package's measured acceptance traces and a step-time cost model (the study's published H100 fit for Llama-3.1-8B by default); (b) *measured* vLLM throughput on the lent H200, where `data/gpu` holds it.

# %% tags=["parameters"]
# Parameters (papermill). Defaults run on the committed embedded data, in seconds, on a CPU.
traces = None          # None: committed traces (data/traces/*.parquet); or a path / glob / list: ours (.parquet)
                       # or the study's published JSON lines (e.g. "combined_instructcoder.jsonl")
model = None           # keep trace files whose name contains this (e.g. "smollm2", "qwen"); None: all
datasets = None        # e.g. ["code-edit", "sharegpt"]; None: every dataset in the traces
proposers = None       # e.g. ["ngram", "early-exit"]; None: every proposer in the traces
k = 3                  # draft tokens per step (the study's k)
backend = "embedded"   # "embedded": committed data; "torch" / "vllm": collect fresh traces live first (with the
                       # torch engine's exact profiler on either; "vllm" also runs vLLM's timings in 01/02)
live_requests = 4      # live runs only: requests per dataset
live_max_new_tokens = 64
figures_dir = None     # set by `spec-repro reproduce`: save figures there (PNG + PDF)
summary_path = None    # set by `spec-repro reproduce`: write this notebook's summary rows there
cost_model = "llama3.1-8b-h100"   # preset name or a cost-model JSON path (e.g. data/gpu fit)
batch_sizes = [1, 2, 4, 8, 16, 32, 64, 128]
vllm_job = None        # None: every committed vLLM job (data/gpu); a job of data/gpu/jobs.json, e.g. "s3-tp2":
                       # only its runs; with backend "vllm": the job to run now (None: "llama8b")
also_h200_fit = True   # also simulate with the cost model fitted to the H200 step logs (data/gpu)
vllm_results = None    # None: the committed runs (data/gpu); or a results.jsonl of vLLM batch runs (`reproduce --profile
                       # gpu`'s Llama-dims runs, no SD and n-gram on vLLM's default engine)
live_dir = None        # None: the committed live runs (data/gpu/v1-runner/agreement); or a folder of `live summarize`'s tables

# %%
from spec_repro import analysis as A, plots as P

# the committed traces, or with a live backend fresh ones; prints their provenance (model, engine, machine, files)
trace = A.notebook_trace(traces, backend=backend, model=model, datasets=datasets, proposers=proposers,
                         n_requests=live_requests, max_new_tokens=live_max_new_tokens)
props = proposers or trace.proposers
SOURCE = A.short_source(trace)     # the one-line version used in captions and the summary table

# %% [markdown]
# **Where the numbers come from.** Acceptance is *measured*: the printed trace provenance names the model, engine, machine and date of each trace (the embedded default is SmolLM2-135M-Instruct decoded greedily on CPU by this package's torch engine, every proposer profiled exactly at every output position). Time is *modelled*: the cost model printed above (by default the study's published Llama-3.1-8B / H100 coefficients) prices each simulated step. So a speedup here reads: *what a target with these step costs would gain with this acceptance*. `eagle` is a head trained by this package (`spec-repro train eagle`) and pays the study's EAGLE drafting cost; the untrained `early-exit` self-draft pays 80% of a one-token target forward per drafted token (its own depth), the `draft` model 37.5% (the study's ratio for 8B targets); the printed notes say so whenever a cost model lacks an entry of its own. Pass `cost_model=` a fitted JSON (e.g. the H200 fit in `data/gpu`) to price steps on other hardware.
#
# **Caveat on the embedded model.** SmolLM2-135M often falls into repetition loops under greedy decoding (7 to 13 of 40 requests per workload have over 30% of positions at full acceptance, gsm-symbolic 3): n-gram acceptance on SmolLM2 is partly an artefact of that, so read its n-gram numbers as an upper side. The Qwen2.5-Coder pair (1.5B target decoded by vLLM 0.25, outputs up to 2,048 tokens, 300 requests per workload where the workload has them, sharegpt 347) loops far less.

# %%
import pandas as pd

cost_models = [cost_model] + ([A.gpu_cost_model_path()] if also_h200_fit and A.gpu_cost_model_path() else [])
sims = []
for name in cost_models:
    cm, notes = A.cost_model_for(trace, name)
    print(cm.summary()); print(*notes, sep="\n"); print()
    s = A.simulate_grid(trace, cm, proposers=props, policies=[f"fixed-{k}"], batch_sizes=batch_sizes)
    sims.append(s.assign(cost_model=cm.name))
sim = pd.concat(sims, ignore_index=True)
sim.pivot_table(index=["dataset", "batch_size"], columns=["cost_model", "proposers"], values="speedup").round(2)

# %% [markdown]
# Measured end-to-end throughput in vLLM (speedup = generated tokens/s with SD ÷ without), when the H200 runs are committed under `data/gpu`:

# %%
gpu_results = vllm_results or (A.live_vllm_job(vllm_job or "llama8b") / "results.jsonl" if backend == "vllm" else None)
if traces is None or gpu_results is not None:
    measured, measured_src = A.gpu_speedups(gpu_results, job=vllm_job if backend != "vllm" else None)
else:  # the committed vLLM runs do not depend on traces=: the default run shows them, not a run on other traces
    measured, measured_src = None, "measured vLLM throughput: not shown with traces= (the default run shows it)"
print(measured_src)
if measured is not None:   # what the figure below shows: speedup by batch size, stalled points left out
    stalled = measured["stalled"].astype(bool) if "stalled" in measured else measured["batch_size"] < 0
    print(f"dropped {stalled.sum()} of {len(measured)} points (their timed run or no-SD baseline stalled on a "
          "first-use compilation):", "; ".join(f"{m} {p.replace(', dummy weights', '')} B={b}" for m, p, b in
                                               measured.loc[stalled, ["model", "proposers", "batch_size"]].values))
    shown = (measured[~stalled].assign(target=measured["dataset"].str.replace(" dims, random prompt", ""),
                                       proposer=measured["proposers"].str.replace(", dummy weights", ""))
             .pivot_table(index=["target", "proposer"], columns="batch_size", values="speedup").round(2))
    shown = shown.astype(object).where(shown.notna(), "")   # blank: not run, or dropped above
else:
    shown = "no measured vLLM throughput in data/gpu: only the simulation is shown"
shown

# %%
fig = P.speedup_vs_batch(sim, title=f"Simulated speedup (fixed k={k}) vs batch size; line style = cost model",
                         source=f"simulated over {SOURCE}; cost models {', '.join(sim['cost_model'].unique())}")
if figures_dir: P.save(fig, "01_speedup_vs_batch", figures_dir)

# %% [markdown]
# Measured in vLLM on the H200 with **dummy weights**: the timing is real, the acceptance is not (random weights make greedy outputs repeat, so n-gram accepts nearly everything and EAGLE nothing; one EAGLE run uses vLLM's synthetic sampler with an *assumed* acceptance length of 2.5). Each proposer's legend entry gives the acceptance length (AL, tokens per step) its runs actually had (a range over the models where it differs); the synthetic-sampler run is the dashed line. Read it as the cost side of finding 1: the same acceptance buys less as the batch grows.

# %%
if measured is not None:
    fig2 = P.speedup_vs_batch(measured, title="Measured vLLM speedup vs batch size, H200, DUMMY WEIGHTS:\n"
                              "the timing is real, the acceptance is not (not comparable with the paper's)",
                              source=measured_src, style="acceptance")
    if figures_dir: P.save(fig2, "01_measured_vllm_speedup", figures_dir)

# %% [markdown]
# Measured in vLLM with **real weights** as vLLM runs by default (`data/gpu/v2grid`, vLLM 0.25.0, one H200): no forced runner, no plugin, no timing hooks, so vLLM chose its **V2 runner with async scheduling** for no SD and EAGLE, and the **V1 runner, synchronous**, for n-gram (V2 has no n-gram path). Qwen2.5-Coder-1.5B-Instruct (bf16) with the package's committed EAGLE head (the head of the traces' `eagle` column) at k = 1, 2, 3, 5 and vLLM's n-gram (prompt lookup 3..7) at k = 5; code-edit and sharegpt, their first 8 / 8 / 32 / 64 requests at bs 1 / 8 / 32 / 64 (bs 1: 8 chunks of one), 256 output tokens each, EOS ignored, one warm-up pass per shape, 3 repeats (speedup = tokens/s ÷ no SD's at the same workload and batch size; each bar runs from the configuration's slowest repeat over no SD's fastest to its fastest over no SD's slowest). EAGLE k = 3 is the fastest configuration on code-edit at every batch size (2.11x at bs 1, 1.26x at bs 64); on sharegpt EAGLE gains 1.3-1.4x at bs 1 and 8 and 0.84-1.40x at bs 32-64; n-gram, on V1, is slower than no SD at every batch size.
#
# **How the host was kept out of the ratios.** On this small target the host sets the pace, and the lent machine's hypervisor steals CPU time in epochs: separately started engines of one configuration ran 0.65-0.81x apart. So no SD and EAGLE's four engines ran resident together on the GPU, every shape in rotated rounds, and each EAGLE engine is divided by the no-SD engine beside it: a host epoch falls on both alike. n-gram (V1) ran alone after, against a no-SD engine started alone; its points whose runs lost 1% or more of their wall time to steal are drawn hollow (`*` in the table): a lower bound.

# %%
if traces is None and backend == "embedded":
    v2, v2_src = A.v2_speedups()
else:  # the committed V2 grid does not depend on traces=: the default run shows it
    v2, v2_src = None, "measured vLLM default engine: not shown with traces= or a live backend"
print(v2_src)
if v2 is not None:
    print("* host-contended (hypervisor steal ≥ 1% of the run): the speedup is a lower bound")
A.v2_table(v2) if v2 is not None else "no V2 grid in data/gpu/v2grid"

# %%
if v2 is not None:
    fig4 = P.speedup_by_configuration(v2, title="Measured vLLM speedup vs batch size: vLLM's default engine "
                                      "(V2 runner), real weights\nQwen2.5-Coder-1.5B, one H200 (below 1: slower than "
                                      "no SD)", source=v2_src)
    if figures_dir: P.save(fig4, "01_live_vllm_speedup", figures_dir)

# %% [markdown]
# The same target measured earlier with **real weights** on the **V1 runner (forced)** (with `live_dir`: that folder's runs, on the runners its title and source line name) (`VLLM_USE_V2_MODEL_RUNNER=0`, where the package's step timing hooks; vLLM itself would run EAGLE and no SD on its V2 runner, which drafted 1.8-2.3x faster per step on one H200 with dummy weights), vLLM's own scheduling (async where vLLM allows it; `data/gpu/v1-runner/agreement`, one H200, 2026-12-01): Qwen2.5-Coder-1.5B-Instruct with the package's EAGLE head, vLLM's n-gram and the package's live hybrids through its vLLM plugin (`pr24344`: n-gram's draft where it matched, else EAGLE's; `pr24344-skip`: EAGLE runs only for steps that need it), code-edit, k = 5, 3 repeats (speedup = tokens/s ÷ no SD's on the same engine and batch). Below 1 is slower than no SD: on the V1 runner (forced), from batch 8 on, every configuration with SD is, on this small target (its decode step is bound by launches and host work, and vLLM 0.25 replays its full CUDA graph only when every request verifies k + 1 tokens; `data/gpu/v1-runner/README.md`).

# %%
if live_dir is not None or (traces is None and backend == "embedded"):
    live, live_src = A.live_speedups(live_dir)
else:  # the committed live runs do not depend on traces=: the default run shows them
    live, live_src = None, "measured vLLM live runs: not shown with traces= or a live backend"
print(live_src)
(live.pivot_table(index="batch_size", columns="method", values="speedup").round(2) if live is not None
 else "no live vLLM runs in data/gpu/v1-runner/agreement")

# %%
if live is not None:
    runners = A.live_runners(live)          # what ran, as the folder recorded it
    other_k = A.live_ks(live)               # engines at another k than the grid's (eagle-k3: k = 3)
    fig3 = P.speedup_vs_batch(live, title=f"Measured vLLM speedup vs batch size, REAL WEIGHTS, {runners}:\n"
                              "Qwen2.5-Coder-1.5B, code-edit, k = 5" + "".join(f" (-k{k}: k = {k})" for k in other_k)
                              + " (below 1: slower than no SD)",
                              source=live_src, style="acceptance")
    if figures_dir: P.save(fig3, "01_live_vllm_speedup_" + ("v2" if runners.startswith("V2") else "v1_forced"),
                           figures_dir)

# %% tags=["nbval-check-output"]
rows = A.finding1_rows(sim, measured, sim_source=f"simulated over {SOURCE}", measured_source=measured_src,
                       live=live, live_source=live_src, v2=v2, v2_source=v2_src)
A.write_summary(rows, summary_path)
