"""The V2 hybrid job's verdict on one screen: each line the study's V2 run must show, its numbers from the summarized
folder (``v2summary``'s ``overhead.csv``, ``ratios.csv``, ``predicted.csv``, ``runs.csv``, ``steps.parquet``) and
PASS or FAIL. A missing file fails its line.

1. the V2 step timer costs at most 3% of throughput at every batch size, no SD and EAGLE (``overhead``: inside
   ``toggle`` runs where they ran, 1 - the mean over runs of the untimed / timed steps' median period; else 1 -
   the mean over interleaved repeats of timer-on / timer-off tok/s; one engine each; the variant every run uses);
2. code-edit, bs 1: the fastest V2 hybrid (at any k the grid ran: ``gpu-pr24344-skip-k3`` at k = 3) runs at least
   1.05x EAGLE alone on V2 (median over repeats of the paired ratio in its rotated engine, at its k) and, where
   EAGLE alone ran faster at the other k (``ratios.csv``'s ``best_eagle``, another engine), 1.05x that too (a
   ratio of means across engines), at least the faster of no SD (V2) and n-gram (V1), and its outputs equal no
   SD's;
3. code-edit, every batch size: the fastest V2 hybrid runs at least 0.98x EAGLE alone (the same two ways), or the
   line names the cost it pays (its median decode step's drafting and other host time beyond EAGLE alone's at its
   k, from the step log);
4. each hybrid's measured tok/s within 10% of its out-of-sample prediction (``ratio_shape``: each step phase as
   measured on no SD and EAGLE alone at the hybrid's k and batch size, its own term its idle machinery's; where a
   table lacks it, ``ratio_per_bs``; the per-batch-size line model printed beside);
5. every run row names its runner, weights and configuration (``runner``, ``weights``, ``engine_config``,
   ``config``), read from the engine's resolved vLLM config.
"""
from __future__ import annotations

from pathlib import Path

from .hybrid_jobs import eagle_alone, split_k
from .v2summary import HYBRIDS, OVERHEAD_LIMIT

BS1_MIN, EVERY_BS_MIN, PRED_TOL = 1.05, 0.98, 0.10
LABELS = ("runner", "weights", "engine_config", "config")


def _mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _read(out: Path, name: str):
    import pandas as pd

    return pd.read_csv(out / name) if (out / name).exists() else None


def overhead_line(out: Path) -> tuple[bool, str]:
    ov = _read(out, "overhead.csv")
    head = f"V2 timer overhead <= {OVERHEAD_LIMIT:.0%} at every batch size"
    if ov is None or not len(ov):
        return False, f"{head}: no overhead.csv"
    beside = ""
    if "timer" in ov.columns:
        # the timer that timed the folder's runs: the package's (``timer``) where this run timed it, else the one
        # that built its rows at the sampler (``drain``); the other variants say where a cost comes from, the same
        # timer with its events recorded by torch's Event.record (``timer-torch``) printed beside
        which = "timer" if (ov["timer"] == "timer").any() else "drain"
        torch_rec = ov[ov["timer"] == "timer-torch"].sort_values(["config", "batch_size"])
        if len(torch_rec):
            beside = " (its events recorded by torch, inside runs: " + "; ".join(
                f"{c}: " + ", ".join(f"bs {b} {o:+.1%}" for b, o in zip(g["batch_size"], g["overhead"]))
                for c, g in torch_rec.groupby("config")) + ")"
        ov = ov[ov["timer"] == which]
        head += f" ({which})"
    parts, ok = [], True
    for c, g in ov.groupby("config"):
        g = g.sort_values("batch_size")
        parts.append(f"{c}: " + ", ".join(f"bs {b} {o:+.1%}" for b, o in zip(g["batch_size"], g["overhead"])))
        if "overhead_blocks" in g and g["overhead_blocks"].notna().all():   # the line holds the in-run estimate
            parts[-1] += (" (inside runs, ±" + "/".join(f"{e:.1%}" for e in g["overhead_blocks_ci95"])
                          + "; whole runs against vLLM's own: "
                          + ", ".join(f"{o:+.1%}" for o in g["overhead_paired"]) + ")")
        if "overhead_host" in g and g["overhead_host"].notna().all():    # reported beside, not what the line holds
            parts[-1] += " (host speed held fixed: " + ", ".join(f"{o:+.1%}" for o in g["overhead_host"]) + ")"
        if "timer_host_share" in g and g["timer_host_share"].notna().all():     # beside too: its own host time
            parts[-1] += " (its own host time: " + ", ".join(f"{o:.1%}" for o in g["timer_host_share"]) + ")"
        ok &= bool(g["within_limit"].all())
    ok &= {"none", "eagle"} <= set(ov["config"])
    return ok, f"{head}: " + "; ".join(parts) + beside


def _best(rt, bs: int):
    """The hybrid row (any k the grid ran) a user would pick: the fastest (``vs_best_eagle``, over the fastest EAGLE
    alone at that batch size, whatever its k; where the table has none, the paired ratio over EAGLE alone in its
    engine)."""
    hyb = rt["config"].map(lambda c: split_k(c)[0] in HYBRIDS)
    h = rt[(rt["workload"] == "code-edit") & (rt["batch_size"] == bs) & hyb]
    h = h.dropna(subset=["vs_eagle_median"])
    key = "vs_best_eagle" if "vs_best_eagle" in h and h["vs_best_eagle"].notna().all() else "vs_eagle_median"
    return None if not len(h) else h.loc[h[key].idxmax()]


def bs1_line(out: Path) -> tuple[bool, str]:
    rt = _read(out, "ratios.csv")
    head = (f"code-edit bs 1: fastest V2 hybrid >= {BS1_MIN}x EAGLE (V2, each k run), >= best of n-gram / no SD, "
            "lossless")
    b = None if rt is None else _best(rt, 1)
    if b is None:
        return False, f"{head}: no paired hybrid runs in ratios.csv"
    ll = str(b["lossless"])          # True / False / nan (not compared)
    lossless = ll == "True"
    other_k, other_ok = _other_k(b, BS1_MIN)
    ok = b["vs_eagle_median"] >= BS1_MIN and other_ok and b["vs_best_other"] >= 1.0 and lossless
    return bool(ok), (f"{head}: {b['config']} {b['vs_eagle_median']:.3f}x EAGLE (paired, {int(b['vs_eagle_pairs'])} "
                      f"repeats, {b['vs_eagle_min']:.3f}-{b['vs_eagle_max']:.3f}){other_k}, {b['vs_best_other']:.3f}x "
                      f"best other (no SD {b['vs_none']:.3f}x, n-gram {b['vs_ngram']:.3f}x), lossless "
                      f"{'yes' if lossless else 'no' if ll == 'False' else 'not compared'}{_counts(b)}")


def _other_k(b, least: float) -> tuple[str, bool]:
    """(``, <r>x <config> (...)`` where EAGLE alone ran faster at another k than in the hybrid's own engine, whether
    the hybrid holds ``least`` against it); ('', True) where its engine's EAGLE was the fastest or no other k ran."""
    best = b.get("best_eagle")
    if not isinstance(best, str) or best == eagle_alone(b["config"]):
        return "", True
    r = float(b["vs_best_eagle"])
    return f", {r:.3f}x {best} (EAGLE alone, another engine: a ratio of means)", r >= least


def _counts(b) -> str:
    """`` (n/m equal; EAGLE alone n/m)`` where counted."""
    import math

    num = lambda v: v is not None and not (isinstance(v, float) and math.isnan(v))     # noqa: E731
    if not all(num(b.get(c)) for c in ("equal", "compared")):
        return ""
    e = f"; EAGLE alone {int(b['eagle_equal'])}/{int(b['eagle_compared'])}" if num(b.get("eagle_equal")) else ""
    return f" ({int(b['equal'])}/{int(b['compared'])} equal{e})"


def _cost(out: Path, config: str, bs: int) -> str:
    """The hybrid's median decode step beyond EAGLE alone's at its k at ``bs`` (code-edit, grid stage): drafting,
    other."""
    import pandas as pd

    f = out / "steps.parquet"
    if not f.exists():
        return "no steps.parquet"
    s = pd.read_parquet(f, columns=["config", "batch_size", "phase", "run_id", "t_draft", "t_other", "stage"])
    s = s[(s["phase"] == "decode") & (s["batch_size"] == bs) & s["run_id"].str.startswith("code-edit")
          & (s["stage"] == "grid")]
    med = s.groupby("config")[["t_draft", "t_other"]].median()
    alone = eagle_alone(config)                        # EAGLE alone in the hybrid's engine, at its k
    if config not in med.index or alone not in med.index:
        return "no steps"
    d = 1e3 * (med.loc[config] - med.loc[alone])
    return f"pays {d['t_draft']:+.2f} ms drafting, {d['t_other']:+.2f} ms other a step"


def every_bs_line(out: Path) -> tuple[bool, str]:
    rt = _read(out, "ratios.csv")
    head = f"code-edit every bs: fastest V2 hybrid >= {EVERY_BS_MIN}x EAGLE (V2, each k run)"
    if rt is None:
        return False, f"{head}: no ratios.csv"
    parts, ok = [], True
    for bs in (1, 8, 32, 64):
        b = _best(rt, bs)
        if b is None:
            parts.append(f"bs {bs} not run")
            ok = False
            continue
        other_k, other_ok = _other_k(b, EVERY_BS_MIN)
        good = b["vs_eagle_median"] >= EVERY_BS_MIN and other_ok
        ok &= bool(good)
        parts.append(f"bs {bs} {b['config']} {b['vs_eagle_median']:.3f}x{other_k}" +
                     ("" if good else f" ({_cost(out, b['config'], bs)})"))
    return ok, f"{head}: " + "; ".join(parts)


def prediction_line(out: Path) -> tuple[bool, str]:
    p = _read(out, "predicted.csv")
    head = f"each hybrid within {PRED_TOL:.0%} of its out-of-sample prediction"
    if p is None:
        return False, f"{head}: no predicted.csv (profile the no-SD outputs: live profile)"
    h = p[p["config"].map(lambda c: split_k(c)[0] in HYBRIDS)]      # each hybrid at each k the grid ran
    if not len(h):
        return False, f"{head}: no hybrid predicted"
    col = "ratio_shape" if "ratio_shape" in p.columns else "ratio_per_bs"

    def span(d, c=col):
        return [f"{w} {cf}: {g[c].min():.3f}-{g[c].max():.3f}" for (w, cf), g in d.groupby(["workload", "config"])]

    within = (h[col] - 1).abs() <= PRED_TOL
    ok = bool(within.all())
    text = (f"{head} ({col}: measured / predicted over bs 1-64; {int(within.sum())} of {len(h)} points): "
            + "; ".join(span(h)))
    if col == "ratio_shape":       # the per-batch-size line model beside (EAGLE at k other than the fit's out of sample)
        line = (h["ratio_per_bs"] - 1).abs() <= PRED_TOL
        text += f" (beside, ratio_per_bs: {int(line.sum())} of {len(h)} within)"
    else:
        other_k = p[p["config"].map(lambda c: split_k(c)[0] == "eagle" and bool(split_k(c)[1]))]   # beside
        if len(other_k):
            text += f" (beside, EAGLE alone at another k, also out of sample: {'; '.join(span(other_k))})"
    return ok, text


def labels_line(out: Path) -> tuple[bool, str]:
    r = _read(out, "runs.csv")
    head = "every run names runner, weights and configuration"
    if r is None or not len(r):
        return False, f"{head}: no runs.csv"
    miss = [c for c in LABELS if c not in r.columns or r[c].isna().any() or (r[c].astype(str) == "").any()]
    seen = ", ".join(sorted({f"{a}/{b}" for a, b in zip(r["runner"], r["engine_config"])})) if not miss else ""
    return not miss, (f"{head}: {len(r)} rows, missing {', '.join(miss)}" if miss else
                      f"{head}: {len(r)} rows ({seen}; weights {', '.join(sorted(set(r['weights'].astype(str))))})")


LINES = (overhead_line, bs1_line, every_bs_line, prediction_line, labels_line)


def verdict(out: str | Path) -> tuple[bool, list[str]]:
    """(every line passes, the printed lines)."""
    res = [f(Path(out)) for f in LINES]
    return all(ok for ok, _ in res), [f"{_mark(ok)}  {text}" for ok, text in res]
