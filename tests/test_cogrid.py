"""Engines resident together, runs rotated (spec_repro.engines.vllm.cogrid): the schedule and the records, with a
recording stand-in for the engine (it times nothing: the GPU run is what measures), and the CPU side of
``v2grid run --co-resident``."""
import json
from types import SimpleNamespace

import pytest

from spec_repro.engines.vllm import cogrid, jobs, v2grid


def _specs(**kw):
    specs = v2grid.grid_specs("HEAD", model_dir="MODEL", draft_dir="DRAFT", **kw)
    return [s for s in specs if s["config"]["method"] in ("none", "eagle")]


class _Run:
    def __init__(self, run_id, n, counters="registry"):
        self.run_id, self.n, self.batch_size, self.counters = run_id, n, None, counters

    def to_dict(self, with_outputs=False):
        return {"run_id": self.run_id, "output_tokens": 4 * self.n, "wall_s": 1.0, "batch_size": self.batch_size,
                "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [],
                **({"outputs": [[1, 2]] * self.n} if with_outputs else {})}


class _Engine:
    """Records what it was asked to run, in one shared log."""

    def __init__(self, cfg, log, fail=False, counters="registry"):
        if fail:
            raise RuntimeError("no memory left for this engine")
        self.cfg = SimpleNamespace(**cfg)
        self.name = f"{cfg['method']}-k{cfg['k']}"
        self.log, self.start_s, self.vllm_version, self.resolved = log, 1.0, "0.25.0", {"runner": "v2"}
        log.append(("start", self.name))
        self.counters = counters

    def run_prompts(self, prompts, max_tokens, *, run_id, record=True, label="", keep_outputs=False):
        self.log.append((label, self.name, run_id))
        return _Run(run_id, len(prompts), self.counters)

    def close(self):
        self.log.append(("close", self.name))


def _run(tmp_path, members, repeats=3, fail_at=None, counters="registry"):
    g = cogrid.group_spec(members)
    g["tasks"][0].update(workloads=["code-edit"], batch_sizes=[1, 8], prompts_per_bs=8, repeats=repeats)
    log, recs, made = [], [], []

    def make(cfg):
        made.append(cfg)
        return _Engine(cfg, log, fail=len(made) == fail_at, counters=counters)

    reqs = [SimpleNamespace(id=f"q{i}", prompt_token_ids=[i, i + 1]) for i in range(8)]
    cogrid.run_group(g, tmp_path, make_engine=make, load_requests=lambda w, n: reqs[:n],
                     append=lambda p, r: recs.append(r), environment=lambda: {})
    return g, log, recs, made


def test_every_engine_starts_before_any_run_and_rounds_rotate(tmp_path):
    members = _specs()
    g, log, recs, made = _run(tmp_path, members)
    names = [f"{m['config']['method']}-k{m['config']['k']}" for m in members]
    assert [e for e in log if e[0] == "start"] == [("start", n) for n in names]
    first_run = next(i for i, e in enumerate(log) if e[0] not in ("start",))
    assert first_run == len(names)
    assert all(c["gpu_memory_utilization"] == 0.15 for c in made)
    bs1 = [e for e in log if e[0] in ("warmup", "hybrid") and "-b1-" in e[2]]
    assert [e[1] for e in bs1[:len(names)]] == names and all(e[0] == "warmup" for e in bs1[:len(names)])
    timed = [e[1] for e in bs1 if e[0] == "hybrid" and "-c0-" in e[2]]   # bs 1: eight chunks per engine and round
    n = len(names)
    assert timed == [names[(r + i) % n] for r in range(3) for i in range(n)]
    assert [e for e in log if e[0] == "close"] == [("close", x) for x in names]


def test_records_read_as_separate_engines_and_finish_the_members(tmp_path):
    members = _specs()
    g, log, recs, _ = _run(tmp_path, members)
    runs = [r for r in recs if r["kind"] == "run"]
    assert {r["spec"] for r in runs} == {m["name"] for m in members}
    assert all(r["group"] == g["name"] and r["config"]["gpu_memory_utilization"] == 0.15 for r in runs)
    # bs 8 with 8 prompts: one chunk; bs 1: eight chunks; 3 rounds on each of the members
    assert len(runs) == len(members) * 3 * (8 + 1)
    done = [r["spec"] for r in recs if r["kind"] == "done"]
    assert done == [m["name"] for m in members] + [g["name"]]
    last = members[-1]["name"]     # read from the registry, the counters are the last-started engine's only
    assert all((r["num_drafts"] is None) == (r["spec"] != last) for r in runs)
    assert all(r["counters"].startswith("not read") for r in runs if r["spec"] != last)
    rows = v2grid.grid_rows(recs)
    assert all(x["acceptance_length"] is None for x in rows)   # the stand-in engine counts no drafts
    assert {r["engine"] for r in rows} == {f"{m['name']}#1" for m in members}
    # what `run_specs` skips after the group: every member and the group
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert jobs.done_specs(path) == {m["name"] for m in members} | {g["name"]}


def test_engines_that_read_their_own_counters_keep_them_all(tmp_path):
    members = _specs()
    _, _, recs, _ = _run(tmp_path, members, counters="engine")
    runs = [r for r in recs if r["kind"] == "run"]
    assert runs and all(r["num_drafts"] == 0 and "counters" not in r for r in runs)


def test_a_group_that_cannot_start_closes_what_started_and_finishes_nothing(tmp_path):
    members = _specs()
    g = cogrid.group_spec(members)
    log, recs = [], []
    made = []

    def make(cfg):
        made.append(cfg)
        return _Engine(cfg, log, fail=len(made) == 3)

    with pytest.raises(RuntimeError, match="no memory"):
        cogrid.run_group(g, tmp_path, make_engine=make, load_requests=lambda w, n: [],
                         append=lambda p, r: recs.append(r), environment=lambda: {})
    assert [e for e in log if e[0] == "close"] == [("close", e[1]) for e in log if e[0] == "start"]
    assert len([e for e in log if e[0] == "start"]) == 2
    assert not [r for r in recs if r["kind"] in ("run", "done")]


def test_group_spec_refuses_what_cannot_share_a_gpu_or_a_schedule():
    members = _specs()
    with pytest.raises(ValueError, match="do not fit"):
        cogrid.group_spec(members, memory_each=0.3)
    with pytest.raises(ValueError, match="at least two"):
        cogrid.group_spec(members[:1])
    other = [members[0], {**members[1], "tasks": [{**members[1]["tasks"][0], "repeats": 5}]}]
    with pytest.raises(ValueError, match="share one hybrid task"):
        cogrid.group_spec(other)
    with pytest.raises(ValueError, match="uninstrumented"):
        cogrid.group_spec([members[0], {**members[1], "instrumented": True}])


def test_v2grid_run_co_resident_puts_the_group_first_then_every_spec(tmp_path, monkeypatch):
    seen = {}

    def fake_run_specs(specs, out, timeout, dry, only, deadline):
        seen.update(specs=specs, timeout=timeout)
        return 0

    monkeypatch.setattr(jobs, "run_specs", fake_run_specs)
    rc = v2grid.main(["run", "--head", "HEAD", "--model-dir", "MODEL", "--draft-dir", "DRAFT", "--out",
                      str(tmp_path), "--co-resident", "--timeout", "300"])
    assert rc == 0
    group, rest = seen["specs"][0], seen["specs"][1:]
    assert [m["name"] for m in group["members"]] == [s["name"] for s in rest if s["config"]["method"] in
                                                     ("none", "eagle")]
    assert group["timeout_s"] == 300 * len(group["members"])
    assert {s["config"]["method"] for s in rest} >= {"ngram", "draft_model"}
    assert v2grid.main(["run", "--head", "HEAD", "--model-dir", "MODEL", "--out", str(tmp_path), "--co-resident",
                        "--memory-each", "0.5"]) == 2


def test_task_shapes_chunks_the_first_requests_of_each_workload_in_runs_of_b():
    from spec_repro.engines.vllm.hybrid_jobs import task_shapes

    task = {"workloads": ["code-edit", "sharegpt"], "batch_sizes": [1, 8, 32], "prompts_per_bs": 8,
            "max_tokens": 256}
    asked = []

    def load(w, n):
        asked.append((w, n))
        return [f"{w}/{i}" for i in range(n)]

    shapes = list(task_shapes(task, "MODEL", 2048, load))
    assert asked == [("code-edit", 32), ("sharegpt", 32)]       # each workload loaded once, in run order
    assert [(w, b, len(ch), len(ch[0])) for w, b, ch in shapes] == [
        (w, b, n, b) for w in task["workloads"] for b, n in ((1, 8), (8, 1), (32, 1))]
    assert shapes[0][2][:2] == [["code-edit/0"], ["code-edit/1"]] and shapes[2][2][0][-1] == "code-edit/31"


def test_run_specs_skips_the_members_a_group_finished_while_it_ran(tmp_path, monkeypatch):
    """The members of a group that finished are not started again one engine at a time (``done`` is read before
    each spec, not once before the first)."""
    members = _specs()
    group = cogrid.group_spec(members)
    specs = [group] + members + [{"name": "v2grid-ngram-k5", "tasks": []}]
    started = []

    def fake_process(cmd, limit):
        spec = json.loads(cmd[cmd.index("--spec") + 1])
        started.append(spec["name"])
        with open(tmp_path / "results.jsonl", "a") as f:
            for n in [m["name"] for m in spec.get("members", [])] + [spec["name"]]:
                f.write(json.dumps({"kind": "done", "spec": n}) + "\n")
        return 0

    monkeypatch.setattr(jobs, "run_group", fake_process)
    assert jobs.run_specs(specs, tmp_path, 300) == 0
    assert started == [group["name"], "v2grid-ngram-k5"]
