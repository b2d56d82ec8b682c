"""A run that reads a decodes file (``spec-repro train eagle --decodes FILE``, a continued head's data): the file is
the training data and the current split only filters it (:func:`spec_repro.train.decodes_training`). A file
written under one split is read under another whose evaluation sets cover more sources: the decodes now in an
evaluation source and those whose prompt no current request rebuilds are dropped and counted, the rest are
trained on, the file's held-out flags stay, and nothing requires the split's prompts to all be in the file."""
from __future__ import annotations

import json

import pytest

from spec_repro import workloads as wl
from spec_repro.train import (_decodes_of_init, _prompt_key, _taken_by, decodes_training, eval_filter,
                              eval_requests, read_decodes, split_by_source, write_decodes)

WORKLOADS = ["py-write", "gsm-symbolic"]
WROTE = {"gsm-symbolic": 20}            # the evaluation sets of the run that wrote the file
NOW = {"gsm-symbolic": 60}              # the evaluation sets now: more gsm-symbolic templates
META = {"target": "t", "max_new_tokens": 8, "seed": 0, "engine": "vllm", "max_prompt_tokens": 1024}


@pytest.fixture(scope="module")
def tok():
    from spec_repro import models

    return models.load("smollm2-135m")[1]


@pytest.fixture(scope="module")
def written(tok, tmp_path_factory):
    """A decodes file of the split under ``WROTE`` (30 prompts a workload) plus one prompt no workload makes;
    every fifth decode held out."""
    split, _ = split_by_source(WORKLOADS, train_n=30, tokenizer=tok, eval_sets=WROTE)
    reqs = [r for w in WORKLOADS for r in split[w]]
    prompts = [list(r.prompt_token_ids) for r in reqs] + [[7, 7, 7, 7]]
    outs = [[i + 1, i + 2] for i in range(len(prompts))]
    held = [i % 5 == 0 for i in range(len(prompts))]
    f = write_decodes(tmp_path_factory.mktemp("dec") / "d.parquet", prompts, outs, held, {**META, "decode": {"s": 1}})
    return f, reqs, prompts, outs, held


def test_a_decodes_file_is_filtered_by_the_current_split_not_required_to_hold_it(tok, written):
    f, reqs, prompts, outs, held = written
    now, _ = split_by_source(WORKLOADS, train_n=30, tokenizer=tok, eval_sets=NOW)
    with pytest.raises(ValueError, match=r"lacks \d+ of this run's"):     # the split alone: not all in the file
        read_decodes(f, [r.prompt_token_ids for w in WORKLOADS for r in now[w]], META)
    ev = {wl.source_key(r) for r in eval_requests(tokenizer=tok, eval_sets=NOW)}
    now_eval = [wl.source_key(r) in ev for r in reqs]
    assert sum(now_eval) >= 3 and not all(now_eval)          # the later sets cover some of the file's sources

    p, o, h, dstats, facts = decodes_training(f, WORKLOADS, META, tokenizer=tok, eval_sets=NOW)
    assert facts["rows"] == len(prompts) == len(reqs) + 1
    assert facts["dropped"] == {"prompt_not_rebuilt": 1, "evaluation_source": sum(now_eval), "repeated_prompt": 0}
    assert facts["dropped_held_out"]["evaluation_source"] == sum(e and held[i] for i, e in enumerate(now_eval))
    want = [i for i, e in enumerate(now_eval) if not e]
    assert p == [prompts[i] for i in want] and o == [outs[i] for i in want] and h == [held[i] for i in want]
    assert facts["kept"] == len(want) and facts["held_out"] == sum(h) > 0
    assert sum(facts["kept_per_workload"].values()) == len(want) and facts["kept_per_workload"]["py-write"] == 30
    evaluated, _ = eval_filter(tokenizer=tok, eval_sets=NOW)
    rebuilt = {_prompt_key(r.prompt_token_ids): r for w in WORKLOADS for r in wl.load(w, tokenizer=tok)}
    assert not any(evaluated(rebuilt[_prompt_key(x)]) for x in p)           # nothing evaluated is trained on
    assert dstats["s"] == 1 and dstats["read_from"] == str(f)

    p2, _, h2, _, f2 = decodes_training(f, WORKLOADS, META, tokenizer=tok, eval_sets=WROTE)   # its own split
    assert f2["dropped"]["evaluation_source"] == 0 and p2 == prompts[:-1] and h2 == held[:-1]
    with pytest.raises(ValueError, match="was decoded with max_new_tokens 8, this run asks 16"):
        decodes_training(f, WORKLOADS, {**META, "max_new_tokens": 16}, tokenizer=tok, eval_sets=NOW)


def test_the_init_head_must_be_the_run_that_held_the_files_decodes_out(tmp_path):
    head = tmp_path / "h"
    head.mkdir()
    assert _decodes_of_init(head, "d", {"s": 1, "read_from": "d"})[0] is False       # no record: not known
    (head / "TRAINING.json").write_text(json.dumps({"data": {"decode": {"greedy": True, "s": 1, "read_from": "x"}}}))
    assert _decodes_of_init(head, "d", {"s": 1, "read_from": "d", "decoded_by": "vllm"})[0] is True
    with pytest.raises(ValueError, match="is not the decode of --init-head"):
        _decodes_of_init(head, "d", {"s": 2, "read_from": "d"})


def test_a_head_trained_from_a_decodes_file_counts_all_its_workloads_prompts_as_seen(tmp_path):
    """A later run without a decodes file cannot hold out a prefix of the split: that head's prompts were not one."""
    from spec_repro.train import EVAL_SETS

    head = tmp_path / "h"
    head.mkdir()
    split = {"py-write": list(range(50)), "gsm-symbolic": list(range(40))}
    facts = {"py-write": {"train_requests": 10, "workload_version": wl.version("py-write"), "from_decodes_file": True},
             "gsm-symbolic": {"train_requests": 10, "workload_version": wl.version("gsm-symbolic")},
             "eval_sets": dict(EVAL_SETS)}
    (head / "TRAINING.json").write_text(json.dumps({"settings": {"seed": 0}, "data": {"workloads": facts}}))
    assert _taken_by(head, split, seed=0, eval_sets=EVAL_SETS, max_prompt_tokens=1024) == {"py-write": 50,
                                                                                            "gsm-symbolic": 10}


def test_a_continuation_trains_on_the_decodes_file_under_a_split_that_changed(tmp_path):
    """``train eagle`` end to end on the CPU: a run decodes and writes the file; a continuation of its head with
    more evaluation requests (a split the file does not hold) trains on the file's decodes less
    those now in an evaluation source, holds out the file's held-out ones and records what it dropped and why."""
    from spec_repro.train import train_from_workloads

    kw = dict(workloads=WORKLOADS, val_n=3, max_new_tokens=3, steps=1, eval_every=1, ckpt_every=100,
              loss_vocab=0, tokens_per_batch=512, ttt_depth=2)
    dec = tmp_path / "d.parquet"
    _, first = train_from_workloads("smollm2-135m", tmp_path / "a", eval_n=5, train_n=5, decodes=dec, **kw)
    assert first["data"]["decodes_file"] == {"path": str(dec), "read": False}
    _, rec = train_from_workloads("smollm2-135m", tmp_path / "b", eval_n=60, train_n=5, decodes=dec,
                                  init_head=tmp_path / "a", **kw)
    d = rec["data"]["decodes_file"]
    assert d["read"] and d["rows"] == 10 and d["kept"] + sum(d["dropped"].values()) == 10
    assert d["dropped"]["evaluation_source"] > 0 and d["kept"] > 0      # eval_n 60: gsm-symbolic templates now out
    assert rec["data"]["held_out_val_sequences"] == d["held_out"] == 3 - d["dropped_held_out"]["evaluation_source"]
    assert rec["init_head"]["held_out_unseen_by_it"] is True
    assert rec["data"]["workloads"]["gsm-symbolic"]["from_decodes_file"] is True
