"""`spec-repro simulate`: the exact CLI contract, on SYNTHETIC published-format fixtures and parquet traces."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from spec_repro.cli import main
from spec_repro.simulate import RESULT_COLUMNS, simulate
from spec_repro.tracefiles import read_trace

FIX = Path(__file__).resolve().parent / "fixtures" / "published"


def test_contract_published_jsonl(tmp_path, capsys):
    out = tmp_path / "res" / "sim.csv"
    files = [str(FIX / "combined_instructcoder.jsonl"), str(FIX / "combined_gsm8k.jsonl")]
    main(["simulate", "--traces", *files, "--cost-model", "llama3.1-8b-h100", "--proposers", "ngram,eagle",
          "--policy", "oracle-combine", "--draft-cost", "ngram-only", "winner", "all", "--batch-sizes", "1", "8", "64",
          "--batching", "duplicate", "--out", str(out), "--no-progress"])
    df = pd.read_csv(out)
    assert list(df.columns) == RESULT_COLUMNS
    assert len(df) == 2 * 3 * 3
    assert set(df["dataset"]) == {"instructcoder", "gsm8k"}  # file stem without combined_
    assert set(df["proposers"]) == {"ngram+eagle"} and set(df["batch_size"]) == {1, 8, 64}
    printed = capsys.readouterr().out
    assert "instructcoder" in printed and f"wrote {out} (18 rows;" in printed
    main(["simulate", "--traces", files[1], "--proposers", "ngram", "--policy", "fixed-3", "--batch-sizes", "1",
          "--out", str(tmp_path / "one.csv"), "--no-progress"])
    assert f"wrote {tmp_path / 'one.csv'} (1 row;" in capsys.readouterr().out
    direct = simulate(read_trace(files[0]), "llama3.1-8b-h100", "ngram,eagle", "oracle-combine", "winner",
                      batch_sizes=[8], progress=False).iloc[0]
    row = df[(df.dataset == "instructcoder") & (df.draft_cost == "winner") & (df.batch_size == 8)].iloc[0]
    assert row.speedup == pytest.approx(direct.speedup, rel=1e-12)


def test_parquet_several_policies_sample_and_mixed(tmp_path):
    t = read_trace(FIX / "combined_sharegpt.jsonl", dataset="code-edit", model="smollm2-135m")
    pq = t.to_parquet(tmp_path / "trace.parquet")
    out = tmp_path / "sim.csv"
    main(["simulate", "--traces", str(pq), "--proposers", "ngram", "--policy", "fixed-1", "fixed-3", "oracle",
          "--batch-sizes", "1", "4", "--batching", "duplicate", "mixed", "--sample", "5", "--seed", "3",
          "--ngram-match-prob", "0.2", "--out", str(out), "--no-progress"])
    df = pd.read_csv(out)
    assert len(df) == 3 * 2 * 2
    assert set(df["dataset"]) == {"code-edit"} and set(df["model"]) == {"smollm2-135m"}  # the parquet's columns
    assert (df["n_requests"] == 5).all()
    assert set(df["policy"]) == {"fixed-1", "fixed-3", "oracle"} and set(df["batching"]) == {"duplicate", "mixed"}
    direct = simulate(t, "llama3.1-8b-h100", "ngram", "fixed-3", batch_sizes=[4], batching="mixed", sample=5, seed=3,
                      ngram_match_prob=0.2, progress=False).iloc[0]
    row = df[(df.policy == "fixed-3") & (df.batching == "mixed") & (df.batch_size == 4)]
    assert row.speedup.iloc[0] == pytest.approx(direct.speedup, rel=1e-12)


def test_fixed_k_on_unknown_dataset_needs_match_prob(tmp_path):
    t = read_trace(FIX / "combined_sharegpt.jsonl", dataset="code-edit")
    pq = t.to_parquet(tmp_path / "t.parquet")
    args = ["simulate", "--traces", str(pq), "--proposers", "ngram", "--policy", "fixed-3", "--out",
            str(tmp_path / "o.csv"), "--no-progress"]
    with pytest.raises(SystemExit, match="ngram_match_prob"):
        main(args)
    main(args + ["--ngram-match-prob", "0.5"])
    assert len(pd.read_csv(tmp_path / "o.csv")) == 1


@pytest.mark.parametrize("extra,msg", [
    (["--proposers", "medusa", "--policy", "oracle"], "unknown proposer"),
    (["--proposers", "ngram", "--policy", "beam"], "unknown policy"),
    (["--proposers", "ngram,eagle", "--policy", "fixed-3"], "takes one proposer"),
    (["--proposers", "ngram", "--policy", "oracle", "--cost-model", "nope"], "unknown cost model"),
])
def test_clear_errors(tmp_path, extra, msg):
    with pytest.raises(SystemExit, match=msg):
        main(["simulate", "--traces", str(FIX / "combined_cnn.jsonl"), *extra, "--out", str(tmp_path / "o.csv"),
              "--no-progress"])
    with pytest.raises(SystemExit, match="no such trace file"):
        main(["simulate", "--traces", str(tmp_path / "missing.jsonl"), "--proposers", "ngram", "--policy", "oracle",
              "--out", str(tmp_path / "o.csv")])


def test_console_script(tmp_path):
    out = tmp_path / "o.csv"
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", str(FIX / "combined_cnn.jsonl"),
                        "--proposers", "eagle", "--policy", "oracle", "--batch-sizes", "1", "128", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert len(pd.read_csv(out)) == 2 and "speedup" in r.stdout


def test_every_committed_proposer_runs_from_the_cli_with_named_presets(tmp_path, capsys):
    """Every proposer of the committed traces has a drafting cost under the named presets of the measured machines
    (stand-ins named on stderr), so the CLI runs each notebook's simulation; the result equals the library's."""
    from spec_repro.costmodel import PRESETS
    from spec_repro.grids import cost_model_for
    from spec_repro.paths import data_dir

    assert {"llama3.1-8b-h100", "llama3.1-8b-h200", "smollm2-135m-cpu"} <= set(PRESETS)
    qwen = data_dir() / "traces" / "qwen2.5-coder-1.5b__code-edit.parquet"
    out = tmp_path / "sim.csv"
    main(["simulate", "--traces", str(qwen), "--proposers", "ngram,eagle", "--policy", "oracle-combine",
          "--cost-model", "llama3.1-8b-h200", "--draft-cost", "all", "--out", str(out), "--no-progress"])
    assert len(pd.read_csv(out)) == 1
    for props in ("early-exit", "draft"):
        main(["simulate", "--traces", str(qwen), "--proposers", props, "--policy", "oracle", "--cost-model",
              "llama3.1-8b-h200", "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert f"note: proposer {props!r} has no drafting model in 'llama3.1-8b-h200'" in err
        t = read_trace(qwen)
        cm, _ = cost_model_for(t, "llama3.1-8b-h200", proposers=[props])
        direct = simulate(t, cm, props, "oracle", progress=False).iloc[0]
        assert pd.read_csv(out).iloc[0].speedup == pytest.approx(direct.speedup, rel=1e-12)
    # proposers written as simulate reads them ('+' as well as ','): the stand-in still applies
    main(["simulate", "--traces", str(qwen), "--proposers", "ngram+early-exit", "--policy", "oracle-combine",
          "--draft-cost", "all", "--cost-model", "llama3.1-8b-h200", "--out", str(out), "--no-progress"])
    assert "note: proposer 'early-exit'" in capsys.readouterr().err and len(pd.read_csv(out)) == 1


def test_help_is_for_users_every_option_has_help_and_there_is_a_version():
    """`spec-repro --help`: a paragraph saying what the package does, the cost-model presets, examples; every
    option of every command carries help; `--version` prints the package's version."""
    import argparse

    from spec_repro import __version__
    from spec_repro.cli import build_parser
    from spec_repro.costmodel import PRESETS

    p = build_parser()
    text = p.format_help()
    assert "Speculative Decoding: Performance or Illusion?" in text and "examples:" in text
    for name in PRESETS:
        assert name in text, name
    missing = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    walk(sp, path + [n])
            elif not a.help:
                missing.append((" ".join(path), a.dest))

    walk(p, ["spec-repro"])
    assert not missing, missing
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"spec-repro {__version__}"


def test_simulate_without_out_prints_a_table_and_writes_nothing(tmp_path):
    trace = Path(__file__).parents[1] / "data" / "traces" / "smollm2-135m__code-edit.parquet"
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", str(trace), "--proposers",
                        "ngram", "--policy", "fixed-3", "oracle", "--batch-sizes", "1", "16", "--no-progress"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["dataset", "proposers", "policy"] and len(lines) == 6
    assert "oracle" in r.stdout and "--out" in lines[-1]
    assert list(tmp_path.iterdir()) == []
