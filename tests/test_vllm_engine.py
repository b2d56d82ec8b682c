"""The vLLM engine without vLLM: configuration for each study method, clear errors (no vLLM / no GPU, unknown
method, missing draft, out-of-memory), metrics parsing, and result handling on outputs recorded on the H200."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro.engines import vllm as V
from spec_repro.engines.vllm import engine as VE
from spec_repro.engines.vllm import steps as VS

FIX = Path(__file__).parent / "fixtures" / "vllm"
CONFIGS = Path(__file__).parents[1] / "data" / "gpu" / "configs"


def test_speculative_config_per_method():
    base = dict(model="m", k=3)
    assert V.speculative_config(V.VLLMConfig(**base, method="none")) is None
    ng = V.speculative_config(V.VLLMConfig(**base, method="ngram"))
    assert ng == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 7}
    for m in ("eagle", "eagle3", "draft_model"):
        sc = V.speculative_config(V.VLLMConfig(**base, method=m, draft="d"))
        assert sc == {"method": m, "num_speculative_tokens": 3, "model": "d"}
    assert V.speculative_config(V.VLLMConfig(**base, method="mtp")) == {"method": "mtp", "num_speculative_tokens": 3}
    syn = V.speculative_config(V.VLLMConfig(**base, method="eagle", draft="d", synthetic_acceptance_length=2.5))
    assert syn["rejection_sample_method"] == "synthetic" and syn["synthetic_acceptance_length"] == 2.5


def test_engine_kwargs_follow_the_study_and_dummy_weights():
    kw = V.engine_kwargs(V.VLLMConfig(model="dir", method="ngram", load_format="dummy", tensor_parallel_size=2,
                                      pipeline_parallel_size=2))
    assert kw["enable_prefix_caching"] is False and kw["enable_chunked_prefill"] is True
    assert kw["async_scheduling"] is False and kw["disable_log_stats"] is False
    assert kw["skip_tokenizer_init"] is True and kw["load_format"] == "dummy"
    assert kw["tensor_parallel_size"] == 2 and kw["pipeline_parallel_size"] == 2
    env = V.engine_env(V.VLLMConfig(model="dir", step_log="x.jsonl"))
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and env["SPEC_REPRO_STEP_LOG"].endswith("x.jsonl")
    assert "async_scheduling" not in V.engine_kwargs(V.VLLMConfig(model="d", async_scheduling=None))
    assert "SPEC_REPRO_DRAFT_CUDAGRAPHS" not in env
    env = V.engine_env(V.VLLMConfig(model="dir", method="draft_model", draft="d", draft_cudagraphs=True))
    assert env["SPEC_REPRO_DRAFT_CUDAGRAPHS"] == "1"
    with pytest.raises(V.VLLMEngineError, match="draft_cudagraphs"):
        V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", draft_cudagraphs=True))


def test_hybrid_option_sets_the_plugins_env_and_refuses_what_it_cannot_run():
    env = V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", hybrid="pr24344-skip"))
    assert env["SPEC_REPRO_HYBRID"] == "pr24344-skip" and "SPEC_REPRO_HYBRID_COST" not in env
    env = V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", hybrid="adaptive-rule",
                                    hybrid_cost_model="h200-qwen.json"))
    assert env["SPEC_REPRO_HYBRID_COST"] == "h200-qwen.json"
    assert "SPEC_REPRO_HYBRID" not in V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d"))
    assert "SPEC_REPRO_HYBRID_PAD" not in env          # padding is off unless asked for
    env = V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", hybrid="ngram-only", hybrid_pad=True))
    assert env["SPEC_REPRO_HYBRID"] == "ngram-only" and env["SPEC_REPRO_HYBRID_PAD"] == "1"
    for kw, msg in [(dict(method="ngram", hybrid="pr24344"), "needs method='eagle'"),
                    (dict(method="eagle", draft="d", hybrid_pad=True), "set hybrid= too"),
                    (dict(method="ngram", hybrid_pad=True), "set hybrid= too"),
                    (dict(method="eagle", draft="d", hybrid="ngram-first"), "one of pr24344"),
                    (dict(method="eagle", draft="d", hybrid="adaptive-rule"), "hybrid_cost_model="),
                    (dict(method="eagle", draft="d", hybrid="pr24344", model_runner="default"), "V1 model runner")]:
        with pytest.raises(V.VLLMEngineError, match=msg):
            V.engine_env(V.VLLMConfig(model="dir", **kw))


@pytest.mark.parametrize("cfg, match", [
    (dict(method="medusa"), "unknown method 'medusa'"),
    (dict(method="eagle"), "needs draft="),
    (dict(method="ngram", k=0), "k must be >= 1"),
    (dict(method="ngram", prompt_lookup_min=5, prompt_lookup_max=3), "prompt_lookup_min"),
])
def test_bad_configuration_is_a_clear_error(cfg, match):
    with pytest.raises(V.VLLMEngineError, match=match):
        V.engine_kwargs(V.VLLMConfig(model="m", **cfg))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_is_a_clear_error_when_building_an_engine():
    with pytest.raises(V.VLLMEngineError, match="vLLM is not installed.*CUDA GPU"):
        V.VLLMEngine(V.VLLMConfig(model=str(CONFIGS / "llama31_8b"), load_format="dummy"))
    # an unknown method fails before any import
    with pytest.raises(V.VLLMEngineError, match="unknown method"):
        V.VLLMEngine(V.VLLMConfig(model="m", method="bogus"))


def test_out_of_memory_messages_become_advice():
    # the exact texts vLLM 0.25.0 raises (vllm/v1/core/kv_cache_utils.py) and torch's CUDA OOM
    for msg in ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
                "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
                "needed, which is larger than the available KV cache memory (9.5 GiB).",
                "CUDA out of memory. Tried to allocate 2.00 GiB"):
        assert VE._is_oom(ValueError(msg))
        err = VE._oom_error(ValueError(msg), V.VLLMConfig(model="m", max_num_seqs=512), "a batch of 512 requests")
        assert "does not fit in GPU memory" in str(err) and "max_num_seqs (now 512)" in str(err)
        assert "tensor_parallel_size" in str(err)
    assert not VE._is_oom(ValueError("unknown architecture"))


def test_parse_spec_metrics_sums_label_sets_and_positions():
    # names as vLLM 0.25.0 registers them (vllm/v1/spec_decode/metrics.py); Counter names lose "_total"
    ms = [{"name": "vllm:spec_decode_num_drafts", "value": 64},
          {"name": "vllm:spec_decode_num_draft_tokens", "value": 192},
          {"name": "vllm:spec_decode_num_accepted_tokens", "value": 190},
          {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": [64, 64, 62]},
          {"name": "vllm:spec_decode_num_drafts", "value": 6},   # a second engine label set
          {"name": "vllm:num_requests_running", "value": 3}]
    p = V.parse_spec_metrics(ms)
    assert p == {"num_drafts": 70, "num_draft_tokens": 192, "num_accepted_tokens": 190, "accepted_per_pos": [64, 64, 62],
                 "generation_tokens": 0}
    d = V.diff_spec_metrics(p, V.parse_spec_metrics([{"name": "vllm:spec_decode_num_drafts", "value": 6}]))
    assert d["num_drafts"] == 64


def _prom_logger(registry, k, label):
    """A stat logger built as vLLM 0.25's PrometheusStatLogger builds one (vllm/v1/metrics/loggers.py,
    vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/utils.py): the registry's vLLM collectors unregistered first,
    then labelled children per engine index."""
    from types import SimpleNamespace

    prometheus_client = pytest.importorskip("prometheus_client")
    for c in list(registry._collector_to_names):
        if any(n.startswith("vllm:") for n in registry._collector_to_names[c]):
            registry.unregister(c)

    def counter(name, extra=()):
        return prometheus_client.Counter(name, name, labelnames=["model_name", "engine", *extra], registry=registry)

    lv = {0: [label, "0"]}
    spec = SimpleNamespace(spec_decoding_enabled=True, **{
        f"counter_{s}": {i: counter(f"vllm:{s}").labels(*v) for i, v in lv.items()}
        for s in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")})
    per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", ["position"])
    spec.counter_spec_decode_num_accepted_tokens_per_pos = {i: [per_pos.labels(*v, str(p)) for p in range(k)]
                                                            for i, v in lv.items()}
    gen = {i: counter("vllm:generation_tokens").labels(*v) for i, v in lv.items()}
    logger = SimpleNamespace(spec_decoding_prom=spec, counter_generation_tokens=gen)
    return logger, SimpleNamespace(llm_engine=SimpleNamespace(logger_manager=SimpleNamespace(
        stat_loggers=[SimpleNamespace(), logger])))


def _observe(logger, drafts, accepted_per_pos, generated):
    sd = logger.spec_decoding_prom
    sd.counter_spec_decode_num_drafts[0].inc(drafts)
    sd.counter_spec_decode_num_draft_tokens[0].inc(drafts * len(accepted_per_pos))
    sd.counter_spec_decode_num_accepted_tokens[0].inc(sum(accepted_per_pos))
    for c, a in zip(sd.counter_spec_decode_num_accepted_tokens_per_pos[0], accepted_per_pos):
        c.inc(a)
    logger.counter_generation_tokens[0].inc(generated)


def test_own_counters_read_each_engine_where_the_registry_holds_only_the_last():
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    first, llm1 = _prom_logger(reg, 3, "first")
    second, llm2 = _prom_logger(reg, 2, "second")      # unregisters the first engine's collectors
    _observe(first, 10, [9, 7, 4], 50)
    _observe(second, 5, [3, 1], 14)
    registry = [{"name": m.name, "value": s.value} for m in reg.collect() for s in m.samples
                if s.name.endswith("_total") and "position" not in s.labels]
    assert {d["value"] for d in registry if d["name"] == "vllm:spec_decode_num_drafts"} == {5.0}
    one, two = V.parse_spec_metrics(VE.own_counters(llm1)), V.parse_spec_metrics(VE.own_counters(llm2))
    assert one == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 20, "accepted_per_pos": [9, 7, 4],
                   "generation_tokens": 50}
    assert two == {"num_drafts": 5, "num_draft_tokens": 10, "num_accepted_tokens": 4, "accepted_per_pos": [3, 1],
                   "generation_tokens": 14}
    from types import SimpleNamespace

    assert VE.own_counters(SimpleNamespace(llm_engine=SimpleNamespace())) is None     # not vLLM's objects: None


def test_recorded_h200_runs_reproduce_their_acceptance_numbers():
    """RunResult.from_counts on the counters recorded on the H200 (n-gram, dummy weights) gives the recorded AL."""
    recs = [json.loads(x) for x in open(FIX / "results_h200.jsonl")]
    runs = [r for r in recs if r["kind"] == "run"]
    assert [r["batch_size"] for r in runs] == [1, 4, 16, 64, 256]
    for r in runs:
        spec = {k: r[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")}
        rr = V.RunResult.from_counts(spec=spec, run_id=r["run_id"], model=r["model"], method=r["method"], k=r["k"],
                                     batch_size=r["batch_size"], n_requests=r["n_requests"],
                                     prompt_len=r["prompt_len"], output_tokens=r["output_tokens"], wall_s=r["wall_s"],
                                     output_tok_per_s=r["output_tok_per_s"])
        assert rr.acceptance_length == pytest.approx(r["acceptance_length"])
        assert rr.per_position_rate == pytest.approx(r["per_position_rate"])
        assert len(rr.accepted_per_pos) == r["k"] == 3
        # every request generated max_tokens = 256 tokens
        assert r["output_tokens"] == 256 * r["batch_size"]
    eng = next(r for r in recs if r["kind"] == "engine")
    assert eng["vllm"] == "0.25.0" and eng["instrumented"] is True and "H200" in eng["env"]["gpu"]


def test_model_dims_and_hbm_floor():
    d = VS.model_dims(CONFIGS / "llama31_8b")
    assert d["params"] == 8_030_261_248 and d["kv_bytes_per_token"] == 131072
    assert d["weight_bytes"] / VS.H200_HBM_BYTES_PER_S == pytest.approx(3.35e-3, rel=0.01)   # the 3.35 ms floor
    q = VS.model_dims(CONFIGS / "qwen3_8b")
    assert 8.1e9 < q["params"] < 8.3e9
    assert 70e9 < VS.model_dims(CONFIGS / "llama3_70b")["params"] < 71e9


def test_moe_dims_and_expert_floor():
    """GLM-4.5-Air: 106B parameters, 12B active (its model card); the floor reads top-k experts per layer."""
    g = VS.model_dims(CONFIGS / "glm45_air")
    assert 105e9 < g["params"] < 108e9 and g["experts"] == 128 and g["experts_per_tok"] == 8
    active = VS.streamed_bytes(g, [1])[0] / g["bytes_per_param"] + g["vocab"] * g["hidden"]   # + embedding rows
    assert 11e9 < active < 13.5e9
    lo = VS.streamed_bytes(g, [1, 4, 64, 1024])
    uni = VS.streamed_bytes(g, [1, 4, 64, 1024], routing="uniform")
    assert (lo == lo[0]).all() and uni[0] == pytest.approx(lo[0]) and (np.diff(uni) > 0).all()
    assert uni[-1] == pytest.approx(g["streamed_weight_bytes"], rel=1e-3)      # 1024 tokens touch every expert
    steps = pd.DataFrame({"batched_tokens": [1], "kv_tokens": [0], "t_verify": [0.01]})
    one, two = VS.add_physical_limits(steps, g), VS.add_physical_limits(steps, {**g, "gpus": 2})
    assert two.verify_floor_s[0] == pytest.approx(one.verify_floor_s[0] / 2)   # tensor parallel: shards in parallel
    with pytest.raises(ValueError, match="routing"):
        VS.streamed_bytes(g, [1], routing="skewed")
    # the dense MiMo-7B target (its MTP layer is not part of the target forward)
    assert 7.4e9 < VS.model_dims(CONFIGS / "mimo_7b")["params"] < 7.9e9


def test_cli_vllm_reports_bad_method_and_missing_vllm():
    from spec_repro.cli import main

    with pytest.raises(SystemExit, match="unknown method 'bogus'"):
        main(["vllm", "run", "--model", "x", "--method", "bogus"])
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(SystemExit, match="vLLM is not installed"):
            main(["vllm", "run", "--model", str(CONFIGS / "llama31_8b"), "--dummy", "--method", "ngram"])


def test_every_device_job_spec_is_a_valid_engine_configuration():
    from spec_repro.engines.vllm.jobs import JOBS

    names = set()
    seen: dict = {}
    for job, specs in JOBS.items():
        for spec in specs:
            # a spec name keys results, step files and `session` labels: one name, one configuration, across all jobs
            assert seen.setdefault(spec["name"], spec) == spec, spec["name"]
            cfg = V.VLLMConfig(**spec["config"])
            kw = V.engine_kwargs(cfg)                      # raises on a bad method / missing draft
            assert (Path(cfg.model) / "config.json").exists() or cfg.model.startswith("/root/"), cfg.model
            if cfg.draft:
                assert (Path(cfg.draft) / "config.json").exists(), cfg.draft
            assert {t["type"] for t in spec["tasks"]} <= {"batches", "overhead", "profile", "prompts"}
            assert kw["max_num_seqs"] >= max(max(t.get("batch_sizes", [1])) for t in spec["tasks"])
            names.add(spec["name"])
    assert {"llama8b-none", "llama8b-ngram", "llama8b-eagle", "smollm2-ngram"} <= names


def test_the_vllm_package_re_exports_its_engine_and_imports_no_vllm():
    import subprocess
    import sys

    code = ("import sys; import spec_repro.engines.vllm as V, spec_repro.engines.vllm.engine as E; "
            "import spec_repro.engines.vllm.plugin, spec_repro.engines.vllm.jobs, spec_repro.engines.vllm.decode, "
            "spec_repro.engines.vllm.hybrid; "
            "assert V.__all__ == E.__all__ and all(getattr(V, n) is getattr(E, n) for n in E.__all__); "
            "assert V.SUPPORTED_VLLM == E.SUPPORTED_VLLM; assert 'vllm' not in sys.modules, 'vllm imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_rotated_engine_installs_its_first_policy_and_refuses_what_it_cannot_switch():
    env = V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", step_log="s.jsonl",
                                    hybrid_rotate=["off", "idle", "gpu-pr24344"]))
    assert env["SPEC_REPRO_HYBRID"] == "idle"          # installed at start; "off" is not a policy to install
    for kw, msg in [(dict(hybrid_rotate=["off", "gpu-pr2434"], step_log="s"), "hybrid_rotate= takes"),
                    (dict(hybrid_rotate=["off"], step_log="s"), "at least one policy"),
                    (dict(hybrid_rotate=["off", "idle"]), "step_log=None"),
                    (dict(hybrid_rotate=["idle"], hybrid="pr24344", step_log="s"), "hybrid_rotate= takes")]:
        with pytest.raises(V.VLLMEngineError, match=msg):
            V.engine_env(V.VLLMConfig(model="dir", method="eagle", draft="d", **kw))
    with pytest.raises(V.VLLMEngineError, match="needs method='eagle'"):
        V.engine_env(V.VLLMConfig(model="dir", method="ngram", hybrid_rotate=["idle"], step_log="s"))
