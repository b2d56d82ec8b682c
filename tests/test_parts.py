"""Large files committed in parts (``spec_repro.parts``): a head's weights and the training decodes are split
into parts of at most 16 MiB with their sha256, joined and verified on load, and a missing or altered part is one
clear line naming it."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from spec_repro import parts
from spec_repro.proposers.eagle import EagleError, check_head_dir, load_head, new_head, save_head
from spec_repro.proposers.eagle_files import PARTS_MANIFEST
from spec_repro.train import read_decodes, write_decodes

from _tiny import tiny_llama


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))


def test_split_then_assemble_is_the_same_bytes(tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(np.random.default_rng(0).bytes(10_000))
    m = parts.split(src, tmp_path / "p", part_bytes=3_000)
    man = json.loads(m.read_text())
    assert [p["bytes"] for p in man["parts"]] == [3000, 3000, 3000, 1000]
    assert parts.assemble(m, tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert parts.cached(m).read_bytes() == src.read_bytes()
    with pytest.raises(parts.PartsError, match="part size"):
        parts.split(src, tmp_path / "q", part_bytes=parts.PART_BYTES + 1)


def test_a_missing_or_altered_part_is_named_and_nothing_is_written(tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(b"x" * 5000 + b"y" * 5000)
    m = parts.split(src, tmp_path / "p", part_bytes=4000)
    (tmp_path / "p" / "w.bin.part1").write_bytes(b"z" * 4000)          # same size, other bytes
    with pytest.raises(parts.PartsError, match=r"part 1 .*w.bin.part1.* is altered"):
        parts.assemble(m, tmp_path / "out.bin")
    (tmp_path / "p" / "w.bin.part2").unlink()
    with pytest.raises(parts.PartsError, match=r"part 1 .* altered"):
        parts.assemble(m, tmp_path / "out.bin")
    shutil.copy(src, tmp_path / "again.bin")
    m = parts.split(tmp_path / "again.bin", tmp_path / "p", part_bytes=4000, name="w.bin")
    (tmp_path / "p" / "w.bin.part2").unlink()
    with pytest.raises(parts.PartsError, match=r"part 2 .* is missing; 3 parts"):
        parts.assemble(m, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()
    (tmp_path / "bad.parts.json").write_text("{not json")
    with pytest.raises(parts.PartsError, match="not a readable parts manifest"):
        parts.read_manifest(tmp_path / "bad.parts.json")


def _head_in_parts(tmp_path):
    target = tiny_llama(seed=0)
    whole = save_head(new_head(target, "eagle", seed=0), tmp_path / "whole")
    d = tmp_path / "committed"
    d.mkdir()
    shutil.copy(whole / "config.json", d / "config.json")
    parts.split(whole / "model.safetensors", d, part_bytes=20_000)
    return target, whole, d


def test_a_head_committed_in_parts_loads_joined_and_verified(tmp_path):
    target, whole, d = _head_in_parts(tmp_path)
    assert len(json.loads((d / PARTS_MANIFEST).read_text())["parts"]) > 2
    got = check_head_dir(d)
    assert got != d and (got / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    a, b = load_head(whole, target), load_head(d, target)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    # the device machine: parts absent, the staged (cached) copy verifies and is used alone
    for p in d.glob("model.safetensors.part[0-9]*"):
        p.unlink()
    assert check_head_dir(d) == got
    # a cached copy that no longer verifies is rebuilt from the parts, which are gone: one line naming part 0
    (got / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(EagleError, match=r"committed: model.safetensors: part 0 .* is missing"):
        check_head_dir(d)


def test_an_altered_head_part_is_one_line(tmp_path):
    target, whole, d = _head_in_parts(tmp_path)
    p = d / "model.safetensors.part1"
    b = bytearray(p.read_bytes())
    b[10] ^= 1
    p.write_bytes(bytes(b))
    with pytest.raises(EagleError, match=r"part 1 .* is altered"):
        load_head(d, target)


def test_decodes_round_trip_keep_their_held_out_set_and_refuse_other_settings(tmp_path):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    outs = [[10, 11], [12], [13, 14, 15]]
    meta = {"target": "t", "max_new_tokens": 8, "seed": 0, "engine": "vllm", "max_prompt_tokens": 1024}
    f = write_decodes(tmp_path / "d.parquet", prompts, outs, [False, True, False], {**meta, "decode": {"s": 1}})
    o, held, st = read_decodes(f, prompts[::-1], meta)           # matched by prompt, not by position
    assert o == outs[::-1] and held == [False, True, False] and st["s"] == 1
    with pytest.raises(ValueError, match="max_new_tokens 8, this run asks 16"):
        read_decodes(f, prompts, {**meta, "max_new_tokens": 16})
    with pytest.raises(ValueError, match="lacks 1 of this run's 4 prompts"):
        read_decodes(f, prompts + [[99]], meta)
    m = parts.split(f, tmp_path / "c", part_bytes=200)            # committed in parts: joined, verified
    assert read_decodes(tmp_path / "c" / "d.parquet", prompts, meta)[0] == outs
    assert read_decodes(m, prompts, meta)[0] == outs


def test_vllm_gets_the_joined_head_of_a_head_in_parts(tmp_path):
    """vLLM loads a folder's model.safetensors: the engine hands it the joined, verified copy of a committed head,
    and an altered part stops it with the part's name before vLLM starts."""
    from spec_repro.engines.vllm import engine as VE

    _target, whole, d = _head_in_parts(tmp_path)
    sc = VE.speculative_config(VE.VLLMConfig(model="m", method="eagle", k=3, draft=str(d)))
    assert sc["model"] != str(d) and (Path(sc["model"]) / "model.safetensors").read_bytes() == \
        (whole / "model.safetensors").read_bytes()
    assert VE.speculative_config(VE.VLLMConfig(model="m", method="eagle", k=3, draft=str(whole)))["model"] == str(whole)
    (Path(sc["model"]) / "model.safetensors").write_bytes(b"junk")
    p = d / "model.safetensors.part1"
    p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1]))
    with pytest.raises(VE.VLLMEngineError, match=r"part 1 .* is altered"):
        VE.speculative_config(VE.VLLMConfig(model="m", method="eagle", k=3, draft=str(d)))
