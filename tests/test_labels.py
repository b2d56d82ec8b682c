"""The runner labels (labels module): configuration names from the forced settings, the runner read from vLLM's
resolved config or its log, and older tables relabelled."""
from types import SimpleNamespace

import pandas as pd

from spec_repro.engines.vllm import labels as L


def test_engine_config_is_default_only_where_vllm_chose_everything():
    assert L.engine_config_label(None, None) == "default"
    assert L.engine_config_label("default", None) == "default"
    assert L.engine_config_label("v1", None) == "v1-forced"
    assert L.engine_config_label("v1", False) == "study-like"
    assert L.engine_config_label(None, False) == "runner-default-sync"
    assert L.canonical_config("vllm-default") == "default"
    for name, fields in L.ENGINE_CONFIGS.items():
        assert L.engine_config_label(fields["model_runner"], fields["async_scheduling"]) == name


def test_vllm_rules_for_a_dense_target():
    assert L.vllm_runner("eagle", None) == "v2" and L.vllm_runner("none", "default") == "v2"
    assert L.vllm_runner("ngram", None) == "v1" and L.vllm_runner("eagle", "v1") == "v1"
    assert L.vllm_async("eagle", None) and not L.vllm_async("ngram", None) and not L.vllm_async("eagle", False)


def test_resolved_engine_reads_vllms_own_config():
    # the layout of vllm.LLM in 0.25: llm.llm_engine.vllm_config, a property use_v2_model_runner
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        use_v2_model_runner=True, scheduler_config=SimpleNamespace(async_scheduling=True))))
    assert L.resolved_engine(llm) == {"runner": "v2", "async_scheduling": True, "runner_source": "vllm_config"}
    assert L.resolved_engine(SimpleNamespace()) == {"runner": None, "async_scheduling": None, "runner_source": None}


def test_runner_from_the_workers_log():
    # log lines as vLLM 0.25's worker and config print them (the V1 runner prints nothing of its own)
    v2 = "(EngineCore_DP0 pid=123) INFO 12-01 20:01:02 [gpu_worker.py:255] Using V2 Model Runner"
    assert L.runner_from_log("INFO loading\n" + v2 + "\n") == "v2"
    assert L.runner_from_log("WARNING MRv2 does not yet support ngram speculative decoding") == "v1"
    assert L.runner_from_log("INFO nothing about runners") is None


def test_run_labels_prefer_what_vllm_reported():
    cfg = {"method": "eagle", "model_runner": "default", "async_scheduling": None}
    got = L.run_labels(cfg, {"resolved": {"runner": "v2", "async_scheduling": True, "runner_source": "vllm_config"}})
    assert got == {"runner": "v2", "runner_forced": None, "runner_source": "vllm_config", "async_scheduling": True,
                   "async_scheduling_forced": None, "engine_config": "default"}
    old = L.run_labels({"method": "eagle", "model_runner": "v1"}, {})       # recorded before vLLM was asked
    assert (old["runner"], old["runner_source"], old["engine_config"]) == ("v1", "config", "v1-forced")


def test_relabel_an_older_table_is_idempotent():
    old = pd.DataFrame({"spec": ["a", "b", "c"], "engine_config": ["default", "default", "study-like"],
                        "method": ["eagle", "none", "none"], "model_runner": ["v1", "default", "v1"],
                        "async_scheduling": [None, None, False], "instrumented": [True, False, True]})
    new = L.relabel_runs(old)
    assert new["engine_config"].tolist() == ["v1-forced", "default", "study-like"]
    assert new["runner"].tolist() == ["v1", "v2", "v1"]
    assert new["async_scheduling"].tolist() == [True, True, False]
    assert new["async_scheduling_forced"].tolist()[2] is False
    assert L.relabel_runs(new).equals(new)
