"""The notebooks' one import (``from spec_repro import analysis as A``): a facade over the modules that follow the
data flow, re-exporting what the notebooks, tests and README use.

- :mod:`spec_repro.paths`: where data and figures live; traces resolved and loaded
- :mod:`spec_repro.metrics`: pure transforms (trace or step table in, tidy DataFrame out), ``phase_shares``
- :mod:`spec_repro.measured`: readers of the committed measurements (``data/gpu``, ``data/cpu``)
- :mod:`spec_repro.grids`: the simulation grids the notebooks run
- :mod:`spec_repro.findings`: the paper's numbers (``PAPER``) and the summary rows beside them
- :mod:`spec_repro.provenance`: what a trace or file is and where it came from
- :mod:`spec_repro.live`: live traces and vLLM jobs
"""
from __future__ import annotations

from .findings import (PAPER, SummaryRow, adaptive_rows, agreement_rows, finding1_rows, finding2_rows,
                       finding3_rows, finding3b_rows, finding4_rows, finding5_rows, focus_dataset, paper_refs,
                       read_summaries, summary_markdown, write_summary)
from .grids import (ADAPTIVE_BATCH_SIZES, COMBINE_PARTNERS, DRAFTER_STANDINS, adaptive_grid, adaptive_report,
                    adaptive_sets, adaptive_summary, adaptive_table, combine_set, confidence_table, cost_model_for,
                    out_of_sample_params, out_of_sample_policy, simulate_grid, tune_rule)
from .live import live_trace, live_vllm_job, notebook_trace
from .measured import (acceptance_agreement, cpu_steps, drafting_sweep, gpu_cost_model_path, gpu_job_specs, gpu_speedups, gpu_steps,
                       gpu_verify_limits, live_ks, live_rotated_runs, live_runners, live_speedups, live_step_split, live_steps,
                       v2_speedups, v2_table, verify_cost)
from .metrics import (PHASES, SHARE_COLUMNS, STUDY_ANALOGUES, acceptance_by_draft_position, acceptance_by_output_position,
                      draft_position_vs_study,
                      hybrid_table, LOOP_DOMINATED, LOOP_WINDOW, MIN_OUTPUT_LEN, loop_share, ngram_advantage, ngram_advantage_by_model, oracle_gap, overlap_threshold,
                      overlap_thresholds, MIN_OVERLAP_REQUESTS,
                      phase_shares, prompt_output_bleu, request_outputs, shares_long, split_by_output_len,
                      tokens_per_step_per_request,
                      tokens_per_step_spread, walk_steps)
from .paths import PUBLISHED_MODEL, data_dir, figures_dir, load_traces, repo_root, trace_files
from .provenance import describe_source, short_source, trace_provenance
from .published import read_draft_position_rates as study_draft_position_rates

__all__ = [
    # paths
    "repo_root", "data_dir", "figures_dir", "trace_files", "load_traces", "PUBLISHED_MODEL",
    # metrics
    "walk_steps", "acceptance_by_output_position", "acceptance_by_draft_position", "STUDY_ANALOGUES",
    "draft_position_vs_study", "study_draft_position_rates", "tokens_per_step_per_request",
    "tokens_per_step_spread", "MIN_OUTPUT_LEN", "LOOP_WINDOW", "LOOP_DOMINATED", "loop_share", "request_outputs",
    "split_by_output_len", "prompt_output_bleu", "ngram_advantage", "ngram_advantage_by_model",
    "overlap_threshold", "overlap_thresholds", "MIN_OVERLAP_REQUESTS", "PHASES", "SHARE_COLUMNS", "phase_shares", "shares_long", "oracle_gap", "hybrid_table",
    # measured
    "gpu_steps", "cpu_steps", "gpu_speedups", "gpu_job_specs", "gpu_cost_model_path", "acceptance_agreement", "gpu_verify_limits",
    "verify_cost", "live_ks", "live_runners", "live_speedups", "live_step_split", "live_steps", "live_rotated_runs", "drafting_sweep",
    "v2_speedups", "v2_table",
    # grids
    "DRAFTER_STANDINS", "cost_model_for", "COMBINE_PARTNERS", "combine_set", "simulate_grid",
    "ADAPTIVE_BATCH_SIZES", "adaptive_sets", "adaptive_grid", "adaptive_table", "adaptive_summary",
    "adaptive_report", "tune_rule", "out_of_sample_params", "out_of_sample_policy", "confidence_table",
    # findings
    "PAPER", "paper_refs", "SummaryRow", "write_summary", "read_summaries", "summary_markdown", "focus_dataset",
    "finding1_rows", "finding2_rows", "finding3_rows", "finding3b_rows", "finding4_rows", "finding5_rows",
    "agreement_rows", "adaptive_rows",
    # provenance
    "describe_source", "short_source", "trace_provenance",
    # live
    "live_trace", "live_vllm_job", "notebook_trace",
]
