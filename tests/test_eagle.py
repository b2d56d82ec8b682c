"""EAGLE-1 / EAGLE-3 heads: lossless drafting in the torch engine, the profiler's exact acceptance, checkpoints in
the published heads' layouts, deterministic training, and one clear line for a head that does not fit."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spec_repro.engines.torch import generate
from spec_repro.proposers import make_proposer
from spec_repro.proposers.eagle import (EagleError, EagleProposer, eagle_chain_acceptance, eagle_chain_argmax,
                                        load_head, new_head, save_head)
from spec_repro.train import distill, train_eagle

from _tiny import VOCAB, hf_greedy, prompts, tiny_llama

N_NEW, K_MAX = 40, 8
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return [hf_greedy(target, p, N_NEW) for p in prompts()]


def _train_pairs(target, n=48, seed=3):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randint(0, VOCAB, (int(k),), generator=g).tolist() for k in torch.randint(4, 20, (n,), generator=g)]
    return list(zip(ps, distill(target, ps, max_new_tokens=N_NEW, batch_size=16, eos_token_ids=[])))


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A tiny EAGLE-1 head trained on the tiny target's own greedy outputs (a few seconds on CPU)."""
    pairs = _train_pairs(target)
    out = tmp_path_factory.mktemp("head") / "eagle"
    head, rec = train_eagle(target, pairs[:40], val_pairs=pairs[40:], out=out, steps=150, lr=3e-3,
                            tokens_per_batch=512, ttt_depth=3, eval_every=150, progress=False,
                            topk=VOCAB)   # the tiny random target's distributions are flat: keep them whole
    return out, rec


def _heads(target, trained):
    h1 = load_head(trained[0], target)
    h3 = new_head(target, "eagle3", seed=1).to(torch.float64)
    return {"eagle": h1, "eagle3": h3}


def test_training_learns_and_writes_vllm_layout(trained):
    out, rec = trained
    held = rec["final_held_out_tokens_per_step"]
    assert held[3] > 1.3 and held[5] >= held[3]          # an untrained head accepts ~nothing (1.0)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    from safetensors.torch import load_file

    keys = set(load_file(str(out / "model.safetensors")))
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "rotary")) for k in keys)   # shared with the target
    assert json.loads((out / "TRAINING.json").read_text())["loss_curve"][-1][0] == 150
    sp = rec["step_split"]                               # steps 20-29 timed phase by phase
    assert sp["steps"] == 10 and all(sp[k] > 0 for k in ("pad_s", "chain_forward_s", "loss_s", "backward_s"))
    assert abs(sp["forward_loss_s"] - sp["chain_forward_s"] - sp["loss_s"]) < 2e-5
    assert 0 < sp["real_tokens_per_step"] <= sp["padded_tokens_per_step"] <= 512


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_eagle_lossless(target, reference, trained, kind, batch, k):
    head = _heads(target, trained)[kind]
    r = generate(target, prompts()[:batch], max_new_tokens=N_NEW, eos_token_ids=[], proposer=EagleProposer(head), k=k)
    assert r.output_ids == reference[:batch]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("k", [2, 5, K_MAX])
def test_profiler_predicts_engine_acceptance_eagle(target, reference, trained, kind, k):
    """The chained profiler pass (every depth at once) equals what the engine's incremental drafting accepts."""
    head = _heads(target, trained)[kind]
    r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[], proposer=EagleProposer(head), k=k)
    acc = [eagle_chain_acceptance(head, p, o, K_MAX) for p, o in zip(prompts(), r.output_ids)]
    for e in r.events.itertuples():
        L = len(r.output_ids[e.request])
        assert min(e.accepted, L - 1 - e.position) == min(acc[e.request][e.position] - 1, k), e
    if kind == "eagle":      # the trained head really accepts, also deeper than one token
        assert r.events.accepted.sum() > 5 and (r.events.accepted >= 2).any()


def test_training_is_deterministic(target, tmp_path):
    pairs = _train_pairs(target, n=12, seed=5)
    kw = dict(steps=6, lr=3e-3, tokens_per_batch=256, ttt_depth=2, progress=False)
    a, _ = train_eagle(target, pairs, out=tmp_path / "a", seed=1, **kw)
    b, _ = train_eagle(target, pairs, out=tmp_path / "b", seed=1, **kw)
    c, _ = train_eagle(target, pairs, out=tmp_path / "c", seed=2, **kw)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_training_resumes_from_its_checkpoint(target, tmp_path):
    pairs = _train_pairs(target, n=12, seed=6)
    kw = dict(steps=8, lr=3e-3, tokens_per_batch=256, ttt_depth=2, progress=False, seed=0)
    whole, _ = train_eagle(target, pairs, out=tmp_path / "whole", **kw)
    import spec_repro.train as T

    calls = {"n": 0}
    real = T._loss

    def dies_after_5(*a, **k):  # a kill after step 5 (checkpoint every 4 steps)
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    T._loss = dies_after_5
    try:
        with pytest.raises(KeyboardInterrupt):
            train_eagle(target, pairs, out=tmp_path / "cut", ckpt_every=4, **kw)
    finally:
        T._loss = real
    # the checkpoint lives inside --out (nothing is written beside it); no head was written yet
    assert (tmp_path / "cut" / ".ckpt" / "state.pt").exists() and not (tmp_path / "cut" / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut", "whole"]
    resumed, _ = train_eagle(target, pairs, out=tmp_path / "cut", ckpt_every=4, **kw)
    assert all(torch.allclose(whole.state_dict()[k], resumed.state_dict()[k]) for k in whole.state_dict())
    assert not (tmp_path / "cut" / ".ckpt").exists()


# ---- checkpoints in the published heads' layouts -----------------------------------------------------------
def _published_eagle1(target, d: Path, bias=True):
    """yuhuili/EAGLE-LLaMA3.1-Instruct-8B's layout at tiny size: pytorch_model.bin with embed_tokens, fc (with
    bias, as EAGLE's own code builds it), layers.0.* without input_layernorm; a LlamaForCausalLM config."""
    c = target.config
    H, hd = c.hidden_size, c.hidden_size // c.num_attention_heads
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * 0.05  # noqa: E731
    w = {"embed_tokens.weight": r(VOCAB, H), "fc.weight": r(H, 2 * H),
         "layers.0.self_attn.q_proj.weight": r(c.num_attention_heads * hd, H),
         "layers.0.self_attn.k_proj.weight": r(c.num_key_value_heads * hd, H),
         "layers.0.self_attn.v_proj.weight": r(c.num_key_value_heads * hd, H),
         "layers.0.self_attn.o_proj.weight": r(H, c.num_attention_heads * hd),
         "layers.0.mlp.gate_proj.weight": r(c.intermediate_size, H), "layers.0.mlp.up_proj.weight": r(c.intermediate_size, H),
         "layers.0.mlp.down_proj.weight": r(H, c.intermediate_size),
         "layers.0.post_attention_layernorm.weight": torch.ones(H, dtype=torch.float64)}
    if bias:
        w["fc.bias"] = r(H)
    d.mkdir(parents=True)
    torch.save(w, d / "pytorch_model.bin")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": c.intermediate_size,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": VOCAB,
           "max_position_embeddings": 1024, "model_type": "llama", "hidden_act": "silu", "torch_dtype": "float16"}
    (d / "config.json").write_text(json.dumps(cfg))
    return w


def _published_eagle3(target, d: Path, draft_vocab=32):
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's layout at tiny size: model.safetensors with d2t/t2d, fc (3H -> H),
    midlayer.* (attention over 2H), norm, lm_head over a draft vocabulary; a LlamaForCausalLMEagle3 config."""
    from safetensors.torch import save_file

    c = target.config
    H, hd = c.hidden_size, c.hidden_size // c.num_attention_heads
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05  # noqa: E731
    keep = torch.arange(0, VOCAB, VOCAB // draft_vocab)[:draft_vocab]       # the draft vocabulary's target ids
    w = {"d2t": keep - torch.arange(draft_vocab), "t2d": torch.zeros(VOCAB, dtype=torch.bool),
         "fc.weight": r(H, 3 * H), "norm.weight": torch.ones(H), "lm_head.weight": r(draft_vocab, H),
         "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
         "midlayer.post_attention_layernorm.weight": torch.ones(H),
         "midlayer.self_attn.q_proj.weight": r(c.num_attention_heads * hd, 2 * H),
         "midlayer.self_attn.k_proj.weight": r(c.num_key_value_heads * hd, 2 * H),
         "midlayer.self_attn.v_proj.weight": r(c.num_key_value_heads * hd, 2 * H),
         "midlayer.self_attn.o_proj.weight": r(H, c.num_attention_heads * hd),
         "midlayer.mlp.gate_proj.weight": r(c.intermediate_size, H), "midlayer.mlp.up_proj.weight": r(c.intermediate_size, H),
         "midlayer.mlp.down_proj.weight": r(H, c.intermediate_size)}
    w["t2d"][keep] = True
    d.mkdir(parents=True)
    save_file(w, str(d / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "intermediate_size": c.intermediate_size,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": VOCAB,
           "draft_vocab_size": draft_vocab, "max_position_embeddings": 1024, "model_type": "llama",
           "hidden_act": "silu", "torch_dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(cfg))
    return w, keep


def test_loads_published_eagle1_layout(target, reference, tmp_path):
    w = _published_eagle1(target, tmp_path / "e1")
    h = load_head(tmp_path / "e1", target)
    assert h.kind == "eagle" and h.fc.bias is not None
    assert torch.equal(h.fc.weight, w["fc.weight"]) and torch.equal(h.layers[0].mlp.down_proj.weight,
                                                                      w["layers.0.mlp.down_proj.weight"])
    r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[], proposer=make_proposer(
        "eagle", target, eagle_head=str(tmp_path / "e1")), k=3)
    assert r.output_ids == reference


def test_loads_published_eagle3_layout_and_maps_the_draft_vocabulary(target, reference, tmp_path):
    w, keep = _published_eagle3(target, tmp_path / "e3")
    h = load_head(tmp_path / "e3", target)
    assert h.kind == "eagle3" and h.aux_layers == (2, 2, 1)       # vLLM's default for a 4-layer target
    D = torch.cat(eagle_chain_argmax(h, prompts()[0], reference[0], 3))
    assert set(D.tolist()) <= set(keep.tolist())                  # drafts only ever name draft-vocabulary ids
    r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[], proposer=make_proposer(
        "eagle3", target, eagle_head=str(tmp_path / "e3")), k=3)
    assert r.output_ids == reference
    assert set(r.events.draft_len) == {3}


def test_save_load_round_trip(target, trained, tmp_path):
    h = load_head(trained[0], target)
    save_head(h, tmp_path / "again", dtype=torch.float64)
    h2 = load_head(tmp_path / "again", target)
    p, o = prompts()[1], hf_greedy(target, prompts()[1], N_NEW)
    assert (eagle_chain_acceptance(h, p, o, 6) == eagle_chain_acceptance(h2, p, o, 6)).all()


# ---- bad input: one clear line, nothing half-written -------------------------------------------------------
def test_bad_heads_fail_with_one_clear_line(target, tmp_path):
    with pytest.raises(EagleError, match="no such directory"):
        load_head(tmp_path / "missing", target)
    (tmp_path / "nocfg").mkdir()
    with pytest.raises(EagleError, match="no config.json"):
        load_head(tmp_path / "nocfg", target)
    _published_eagle1(target, tmp_path / "noweights")
    (tmp_path / "noweights" / "pytorch_model.bin").unlink()
    with pytest.raises(EagleError, match="no model.safetensors or pytorch_model.bin"):
        load_head(tmp_path / "noweights", target)
    w = _published_eagle1(target, tmp_path / "unknown")
    torch.save({k.replace("fc.", "fusion."): v for k, v in w.items()}, tmp_path / "unknown" / "pytorch_model.bin")
    with pytest.raises(EagleError, match="unknown EAGLE head layout"):
        load_head(tmp_path / "unknown", target)
    wide = tiny_llama(seed=2)
    _published_eagle1(target, tmp_path / "h64")
    cfg = json.loads((tmp_path / "h64" / "config.json").read_text())
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2)).double()
    with pytest.raises(EagleError, match="hidden size 64 does not match the target's embedding width 32"):
        load_head(tmp_path / "h64", other)
    cfg["vocab_size"] = VOCAB + 10
    (tmp_path / "h64" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match=f"vocabulary {VOCAB + 10} does not match the target's {VOCAB}"):
        load_head(tmp_path / "h64", wide)
    cfg["vocab_size"] = VOCAB
    cfg["intermediate_size"] = 96
    (tmp_path / "h64" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="has shape .* expected"):
        load_head(tmp_path / "h64", wide)


def test_save_head_leaves_nothing_half_written(target, trained, tmp_path, monkeypatch):
    import safetensors.torch

    h = load_head(trained[0], target)
    save_head(h, tmp_path / "good")
    before = (tmp_path / "good" / "model.safetensors").read_bytes()

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError):
        save_head(h, tmp_path / "good")
    assert (tmp_path / "good" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good"]


def test_cli_collect_eagle_without_a_usable_head_is_one_line(tmp_path):
    for extra, want in (([], "needs --eagle-head"), (["--eagle-head", str(tmp_path / "nope")], "no such directory")):
        r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "collect", "--workloads", "code-edit", "-n", "1",
                            "--proposers", "ngram", "eagle", "--out", str(tmp_path / "t"), *extra],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode != 0 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").rglob("*.jsonl"))


# ---- the loss: sparse target distributions, a loss vocabulary, one fused pass --------------------------------
def _sparse_problem(seed, n, H, V, K):
    """Features h (n, H), LM-head rows W (V, H), and K-sparse target distributions (probs, cols), in float64."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, H, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(V, H, dtype=torch.float64, generator=g)
    p, cols = torch.softmax(torch.randn(n, V, dtype=torch.float64, generator=g), -1).topk(K, -1)
    return g, h, W, p / p.sum(-1, keepdim=True), cols


def test_sparse_ce_equals_autograd_cross_entropy():
    from spec_repro.train import _SparseCE

    _, h, W, p, cols = _sparse_problem(0, 37, 16, 50, 5)
    loss = _SparseCE.apply(h, W, cols, p, 8)      # chunks of 8 rows: the last one is ragged
    (2.0 * loss).backward()
    got = h.grad.clone()
    h.grad = None
    ref = -(p * torch.log_softmax(h @ W.T, -1).gather(1, cols)).sum()
    (2.0 * ref).backward()
    assert abs(float(loss) - float(ref)) < 1e-4 * abs(float(ref))
    assert torch.allclose(got, h.grad, atol=1e-5)


def test_sparse_ce_rows_of_weight_zero_count_for_nothing():
    """Padding and a depth's first positions come as rows whose distribution is all zero: their loss and
    gradient are exactly 0, and the other rows' equal the loss over those rows alone."""
    from spec_repro.train import _SparseCE

    g, h, W, p, cols = _sparse_problem(1, 29, 8, 40, 4)
    keep = torch.rand(len(h), generator=g) < 0.6
    _SparseCE.apply(h, W, cols, p * keep[:, None], 8).backward()
    got = h.grad.clone()
    h.grad = None
    ref = _SparseCE.apply(h[keep], W, cols[keep], p[keep], 8)
    ref.backward()
    assert torch.all(got[~keep] == 0) and torch.allclose(got[keep], h.grad[keep], atol=1e-12)
    h.grad = None
    assert abs(float(_SparseCE.apply(h, W, cols, p * keep[:, None], 8)) - float(ref)) < 1e-9


def test_loss_over_a_vocabulary_restricts_the_target_distribution(target):
    """With a loss vocabulary, the loss equals cross-entropy over (the vocabulary + every position's top token)
    against the target's distribution restricted to those rows and renormalised (computed here the slow way)."""
    from spec_repro.proposers.eagle import new_head
    from spec_repro.train import _loss

    torch.manual_seed(0)
    head = new_head(target, "eagle", seed=0).to(next(target.parameters()).dtype)
    g = torch.Generator().manual_seed(2)
    B, N, K = 2, 9, 6
    V = int(target.get_output_embeddings().weight.shape[0])
    ids = torch.randint(0, V, (B, N), generator=g)
    lens = [9, 6]
    feats = torch.randn(B, N, head.cfg["hidden_size"], generator=g).to(next(target.parameters()).dtype)
    t_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(B * N)]).reshape(B, N, K).to(torch.int32)
    t_p = torch.softmax(torch.randn(B, N, K, generator=g), -1).sort(-1, descending=True).values
    t_p[1, 6:] = 0
    vocab = torch.randperm(V, generator=g)[: V // 4].sort().values
    loss, parts = _loss(head, ids, feats, lens, 2, 0.0, (t_ids, t_p), vocab)
    outs = head.chain(ids[:, 1:], feats[:, :-1], 2)
    Wt = head.target.get_output_embeddings().weight
    want = []
    for d, out in enumerate(outs, start=1):
        tot, n = 0.0, 0
        for b in range(B):
            for i in range(d - 1, lens[b] - 1):
                ti, tp = t_ids[b, i + 1].long(), t_p[b, i + 1].double()
                rows = torch.unique(torch.cat([vocab, t_ids[:, 1:, 0].reshape(-1).long()]))
                inr = torch.isin(ti, rows)
                q = tp * inr / (tp * inr).sum()
                lp = torch.log_softmax((out[b, i] @ Wt[rows].T).double(), -1)
                pos = torch.searchsorted(rows, ti)
                tot += float(-(q[inr] * lp[pos[inr]]).sum())
                n += 1
        want.append(tot / n)
    assert np.allclose(parts.tolist(), want, rtol=1e-4)
    assert abs(float(loss) - (want[0] + 0.8 * want[1]) / 1.8) < 1e-4 * abs(float(loss))


def test_loss_vocabulary_keeps_the_most_frequent_top_tokens():
    from spec_repro.train import loss_vocabulary

    tops = [(torch.tensor([[3, 1], [3, 2], [5, 1]], dtype=torch.int32), None),
            (torch.tensor([[3, 0], [7, 1]], dtype=torch.int32), None)]
    rows, cover = loss_vocabulary(tops, 2, 10)
    assert sorted(rows.tolist()) in ([3, 5], [3, 7]) and abs(cover - 0.8) < 1e-6     # 3 is top 3 times, 5 and 7 once
    assert loss_vocabulary(tops, 0, 10) == (None, 1.0) and loss_vocabulary(tops, 10, 10) == (None, 1.0)


def test_training_continues_from_an_init_head(target, tmp_path):
    """``init_head``: training starts from that head's weights (one step at a vanishing learning rate writes the
    same weights back), the record and the settings name its sha256 and its own steps; a head of another shape is
    one clear line."""
    import hashlib

    pairs = _train_pairs(target, n=12, seed=7)
    kw = dict(tokens_per_batch=256, ttt_depth=2, progress=False)
    train_eagle(target, pairs, out=tmp_path / "a", steps=6, lr=3e-3, **kw)
    a = tmp_path / "a" / "model.safetensors"
    _, rec = train_eagle(target, pairs, out=tmp_path / "b", steps=1, lr=1e-20, init_head=tmp_path / "a", **kw)
    fresh, _ = train_eagle(target, pairs, out=tmp_path / "c", steps=1, lr=1e-20, **kw)
    wa = load_head(tmp_path / "a", target).state_dict()
    wb = load_head(tmp_path / "b", target).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], v) for k, v in fresh.state_dict().items() if k in wa)
    sha = hashlib.sha256(a.read_bytes()).hexdigest()
    assert rec["init_head"]["sha256"] == rec["settings"]["init_head_sha256"] == sha
    assert rec["init_head"]["steps_done"] == 6 and rec["settings"]["depth_decay"] == 0.8
    other = tiny_llama(seed=0, vocab=VOCAB + 8)           # another target's vocabulary
    with pytest.raises(ValueError, match="^--init-head: .*vocabulary"):
        train_eagle(other, [([1, 2], [3, 4, 5])], out=tmp_path / "d", steps=1, init_head=tmp_path / "a", **kw)
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match="^--init-head: .*no such directory"):
        train_eagle(target, pairs, out=tmp_path / "e", steps=1, init_head=tmp_path / "nope", **kw)
    assert not (tmp_path / "e").exists()


def test_depth_decay_weighs_the_chain_depths(target):
    """The loss is the depth-weighted mean of the per-depth cross-entropies: with weight 1 every depth alike."""
    from spec_repro.proposers.eagle import target_features
    from spec_repro.train import _loss, _pad, target_topk

    head = new_head(target, "eagle", seed=0).to(torch.float64)
    pairs = _train_pairs(target, n=3, seed=8)
    seqs = [p + o for p, o in pairs]
    feats = [target_features(target, torch.tensor([s]), "final")[0] for s in seqs]
    tops = target_topk(target, feats, 8)
    ids, fb, tb = _pad(seqs, feats, tops, [0, 1, 2], torch.device("cpu"))
    lens = [len(s) for s in seqs]
    called = []
    for w in (1.0, 0.5):
        loss, parts = _loss(head, ids, fb, lens, 3, 0.0, tb, decay=w, on_chain=lambda: called.append(1))
        want = sum(w ** d * float(parts[d]) for d in range(3)) / sum(w ** d for d in range(3))
        assert abs(float(loss.detach()) - want) < 1e-5 * want
    assert called == [1, 1] and float(parts[2]) != float(parts[0])


def test_training_with_a_loss_vocabulary_learns(target, tmp_path):
    """A loss vocabulary smaller than the target's still trains (its softmax also holds every position's top
    token), and the record says how much of the top tokens it covers; held-out drafting uses the whole
    vocabulary."""
    pairs = _train_pairs(target, n=48, seed=3)
    _, rec = train_eagle(target, pairs[:40], val_pairs=pairs[40:], out=tmp_path / "h", steps=60, lr=3e-3,
                         tokens_per_batch=512, ttt_depth=2, eval_every=60, progress=False, topk=VOCAB,
                         loss_vocab=VOCAB // 3)
    lv = rec["loss_vocabulary"]
    assert lv["size"] == VOCAB // 3 and 0.3 < lv["top_token_coverage"] < 1.0
    assert rec["final_held_out_tokens_per_step"][3] > 1.15
    cond = rec["final_held_out_draft_position_rate"], rec["held_out"][-1]["conditional_position_rate"]
    assert abs(cond[0][1] - cond[1][1]) < 1e-12 and all(0 <= v <= 1 for v in cond[1].values())
    assert rec["train_tokens_per_s"] > 0 and rec["settings"]["loss_vocab"] == VOCAB // 3
