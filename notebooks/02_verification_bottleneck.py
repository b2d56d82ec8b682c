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
# # Finding 2: verification dominates a speculative step
#
# **Paper** (vLLM 0.10, H100): the target's verification pass takes **42%-95%** of execution time (42%: draft model on Qwen3-8B at batch 1, where drafting takes 47%; 95%: n-gram on Llama-3-70B at batch 512). Rejection sampling stays **below 1.7%**.
#
# **This notebook**: (a) the *measured* four-phase breakdown (drafting, verification, rejection sampling, overhead) from vLLM step logs on the H200 (`data/gpu`, instrumented with this package's vLLM plugin); (b) the measured verification time next to its HBM-bandwidth floor; (c) the *measured* CPU cost of verifying k draft tokens with the embedded SmolLM2-135M (`data/cpu/verify_cost.csv`): forward time of k+1 tokens vs 1 token.

# %% tags=["parameters"]
# Parameters (papermill). Defaults read the committed measurements; nothing runs live.
backend = "embedded"   # "embedded": committed data/gpu + data/cpu; "vllm": run the vLLM device job now (GPU host)
vllm_job = None        # None: every committed vLLM job (data/gpu); a job of data/gpu/jobs.json, e.g. "s3-tp2":
                       # only its steps; with backend "vllm": the job to run now (None: "llama8b")
figures_dir = None     # set by `spec-repro reproduce`: save figures there (PNG + PDF)
summary_path = None    # set by `spec-repro reproduce`: write this notebook's summary rows there
steps_files = None       # None: data/gpu step logs; or a path / list of step-timing files
verify_cost_file = None  # None: data/cpu/verify_cost.csv
vllm_results = None      # None: as backend says; or a results.jsonl of vLLM runs: the step logs beside it
live_dir = None          # None: the committed live runs (data/gpu/v1-runner/agreement); or a folder of `live summarize`'s tables

# %%
from pathlib import Path

from spec_repro import analysis as A, plots as P

if vllm_results is not None:
    steps_files = sorted(Path(vllm_results).parent.glob("steps_*.jsonl")) or None
elif backend == "vllm":
    steps_files = sorted(A.live_vllm_job(vllm_job or "llama8b").glob("steps_*.jsonl"))
steps, steps_src = A.gpu_steps(steps_files, job=vllm_job if backend != "vllm" else None)
print(steps_src)

# %% [markdown]
# ### (a) Where a decode step's time goes, measured in vLLM on the H200
#
# Target models with the study's **dimensions and dummy (random) weights**: timing is real, acceptance is not (see `data/gpu/README.md`), so this is about the cost of each phase, not about speedups. Time-weighted shares over decode steps (prefill and chunked-prefill steps excluded; JIT-compilation outliers dropped).

# %%
if steps is not None:
    shares = A.phase_shares(steps)
    display(shares.round(3))
    fig = P.time_breakdown(shares, facet=["model", "method"], source=steps_src)
    if figures_dir: P.save(fig, "02_time_breakdown", figures_dir)
else:
    shares = None
    print("No step logs found: the GPU breakdown is not shown (run the vLLM job on a GPU: backend='vllm').")

# %% [markdown]
# **Against the paper.** The top of its range, n-gram on Llama-3-70B at batch 512 (95% on four H100s), is ~90% here on two H200s (tensor parallel 2). The bottom, the draft model on Qwen3-8B at batch 1 (verification 42%, drafting 47%), comes out lower here because vLLM 0.25's draft-model path is slow: its V1 runner never replays the draft model's CUDA graphs (fixed upstream in vLLM PR #47460; the committed run applies that fix through this package's plugin, `draft_cudagraphs=True`), and even then the 0.6B drafter's 28 attention layers run eagerly between graph pieces. 'The rest' is larger than the study's 1.2 ms per step: vLLM 0.25's host-side input preparation in synchronous mode. MTP rows are MiMo-7B (one GPU) and GLM-4.5-Air (two GPUs), the study's MTP model; with dummy weights their acceptance, and so their steps per token, mean nothing, but each step's phase times are real.

# %% [markdown]
# ### (a2) The same breakdown with real weights, on vLLM's V1 runner (forced)
#
# Qwen2.5-Coder-1.5B-Instruct, real weights, the package's EAGLE head, code-edit, k = 5 (with `live_dir`: that folder's runs, on the runners its title and source line name; by default `data/gpu/v1-runner/agreement`, one H200, the V1 runner forced for the step timing (vLLM would pick V2 for EAGLE and no SD), async scheduling for no SD, EAGLE and the hybrids; vLLM runs n-gram synchronously). On a 1.5B target the forward is the small part: EAGLE's drafting and the step's host work outweigh verification. The second table splits the steps by batch shape: vLLM 0.25's V1 runner replays its full CUDA graph only for *uniform* decode batches (every request verifies k + 1 tokens); a *ragged* one (n-gram found no match for some request) pays several times as much for the same forward.

# %%
live_st, live_src = (A.live_steps(live_dir) if live_dir is not None or backend == "embedded"
                     else (None, "live vLLM steps: not shown with a live backend"))
print(live_src)
live_shares = A.phase_shares(live_st) if live_st is not None else None
if live_shares is not None:
    display(live_shares.round(3))
    fig = P.time_breakdown(live_shares, facet="method", title="Where a decode step's time goes: vLLM, REAL WEIGHTS, "
                           f"{A.live_runners(live_st)}\n(Qwen2.5-Coder-1.5B, code-edit, k = 5"
                           + "".join(f"; -k{k}: k = {k}" for k in A.live_ks(live_st)) + ")", source=live_src)
    if figures_dir: P.save(fig, "02_time_breakdown_live", figures_dir)
    display(A.live_step_split(live_dir).round(2))

# %% [markdown]
# **What sets a step's time on a small target: the host.** One EAGLE engine (`data/gpu/v1-runner/rotated-code-edit`, the committed run) switched its policy run by run (EAGLE alone, the idle hybrid, the device-side hybrids), so every run below ran in the same process; each point is one run's median decode step. Each policy's verification (blue) is flat to a few hundredths of a millisecond at every batch size. Drafting and the rest, both host work on a 1.5B model, drift by up to ~1.8x for a minute at a time, whichever policy is running. The lent H200 is a virtual machine; comparisons between separate engines, or against a cost model fitted at another time, inherit that drift.

# %%
rot, rot_src = (A.live_rotated_runs() if live_dir is None and backend == "embedded"
                else (None, "the rotated engine's runs: the committed ones only (data/gpu/v1-runner/rotated-code-edit)"))
print(rot_src)
if rot is not None:
    display(rot.groupby(["batch_size", "config"])[["verification", "drafting", "rest"]]
            .agg(["min", "median", "max"]).round(2))
    fig = P.phases_by_run(rot, title="One engine, its policies switched run by run: each phase's median step time\n"
                          "(vLLM, REAL WEIGHTS, Qwen2.5-Coder-1.5B + the package's EAGLE head, code-edit, k = 5)",
                          source=rot_src)
    if figures_dir: P.save(fig, "02_host_drift_live", figures_dir)

# %% [markdown]
# ### (a3) EAGLE's drafting time per drafted token
#
# One EAGLE engine per k = 1, 3, 5, 8, 12 on each target's dimensions with its head's (Llama-3.1-8B and its EAGLE head; Qwen2.5-Coder-1.5B and the package's head), dummy weights (vLLM's padded drafter batch drafts over every verified token whatever was accepted, so the time does not depend on the weights), bs 1, 8, 32, 64, two repeats (`data/gpu/v1-runner/draft-k`). The fit `d0 + k·d1` (`costmodel.fit_drafting`) is what the H200 presets now price EAGLE with (`python -m spec_repro.costmodel fit-drafting`). **Against the study:** its fit prices EAGLE independently of k (16 tokens 2.155 ms vs 2.142 ms for one, vLLM 0.10 on an H100); on vLLM 0.25 every drafted token is one more head forward and the fixed part d0 is nil (0.01 ms on Llama dims, 0 on Qwen's), so 12 tokens cost 12 times one. On Llama dims a head forward runs at 70% of its HBM floor at bs 1; on the 1.5B target it is host-bound (about 0.24 ms a token when the host is fast, 0.43 ms when it is slow, against a 0.12 ms floor), hence the lower R².

# %%
dk_runs, dk_fits, dk_src = (A.drafting_sweep() if backend == "embedded" and live_dir is None
                            else (None, None, "the drafting-time sweep: the committed one only (data/gpu/v1-runner/draft-k)"))
print(dk_src)
if dk_runs is not None:
    display(dk_fits.round(3))
    fig = P.drafting_vs_k(dk_runs, dk_fits, source=dk_src)
    if figures_dir: P.save(fig, "02_drafting_vs_k", figures_dir)

# %% [markdown]
# ### (b) Verification against its physical limit
#
# A decode step's target forward must at least stream the weights and read the KV cache from HBM. Below, the measured forward time next to that floor (bytes ÷ the H200's 4.8 TB/s datasheet bandwidth, times the GPUs a tensor-parallel target spans; for the MoE, the top-k experts per layer that a forward reads at least). While the measured time tracks the floor, verifying k+1 tokens per request costs about as much as decoding 1; once it leaves the floor (large batches × k+1 tokens) verification is compute-bound and every rejected draft token is paid for.

# %%
limits, limits_src = A.gpu_verify_limits()
print(limits_src)
if limits is not None:
    display(limits[["model", "method", "batch_size", "batched_tokens", "t_verify_ms", "floor_ms", "bw_util",
                    "vs_no_sd"]].round(3))
    fig = P.verify_vs_floor(limits, source=limits_src)
    if figures_dir: P.save(fig, "02_verify_vs_hbm_floor", figures_dir)

# %% [markdown]
# ### (c) The same question on this machine's CPU
#
# SmolLM2-135M (real weights) on the CPU that built the embedded traces: one forward of k+1 tokens after a 512-token cache vs one token. A CPU has little parallel compute to hide extra tokens in, so verification cost grows with k much sooner than on a GPU. (Shared CPU: noisy; medians of repeats.)

# %%
vc, vc_src = A.verify_cost(verify_cost_file)
print(vc_src)
if vc is not None:
    display(vc.round(3))
    fig = P.verify_cost_curve(vc, hue="device" if "device" in vc else None, source=vc_src)
    if figures_dir: P.save(fig, "02_verify_cost_cpu", figures_dir)

# %% [markdown]
# ### (d) The same breakdown in this package's torch engine on the CPU
#
# SmolLM2-135M with real weights, the embedded workloads, k = 3: the reference engine times the same four phases (drafting, verification = target forward, acceptance, the rest).

# %%
cpu_st, cpu_src = A.cpu_steps()
print(cpu_src)
cpu_shares = A.phase_shares(cpu_st) if cpu_st is not None else None
if cpu_shares is not None:
    display(cpu_shares.round(3))
    fig = P.time_breakdown(cpu_shares, facet=["model", "method"], title="Where a decode step's time goes: "
                           "torch engine, CPU", source=cpu_src,
                           paper_verify_range=None)  # the paper's 42-95% is a GPU range: not drawn on CPU
    if figures_dir: P.save(fig, "02_time_breakdown_cpu", figures_dir)

# %% tags=["nbval-check-output"]
rows = A.finding2_rows(shares, steps_src, vc, vc_src, limits, limits_src, cpu_shares, cpu_src, live_shares, live_src)
A.write_summary(rows, summary_path)
