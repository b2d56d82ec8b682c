"""GSM-Symbolic: GSM8K-derived templated word problems (Mirzadeh et al. 2024) as implemented by the
generators in the wheel ``reasoning-gym`` (Apache-2.0). Only the three pure-Python source files are read out of
the wheel and run here (its heavy dependencies are never installed). Item ``i`` for seed ``s`` equals
``reasoning_gym.create_dataset("gsm_symbolic", seed=s, size=...)[i]``."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from random import Random

from ._base import WheelSource, WorkloadError, cached_members, user_message, workload_dir

_DIR = "reasoning_gym/arithmetic/gsm_symbolic/"
SOURCE = WheelSource(
    requirement="reasoning-gym==0.1.25",
    sha256="7f17a3eddb13c015d7d4a755ed576a061df889faf9468bcc2cca334ebe9e0435",
    license="Apache-2.0",
    homepage="https://github.com/open-thought/reasoning-gym",
    members=("reasoning_gym/utils.py", _DIR + "gsm_symbolic.py", _DIR + "generators_00_49.py",
             _DIR + "generators_50_99.py"),
)
#: sha256 of each member as read out of the pinned wheel: cached copies are checked against these (pinned here, not
#: in the cache's own manifest, which whoever can write the cache could rewrite too) before any of them is run.
MEMBER_SHA256 = {
    "reasoning_gym/utils.py": "25fe815ebfce019dad92aa79e61528e0418a04edbce2aa86d019a5a3f186e9d1",
    _DIR + "gsm_symbolic.py": "511e30a979511719c65019082ea298e215f4fbfab7d7660b384fa51c0fd03ee1",
    _DIR + "generators_00_49.py": "78b85da5a9225fec76d7fc27e1bad207b0dfb58b386d5e3c1089b9542c04b1e7",
    _DIR + "generators_50_99.py": "29e28c60ac623defb0acabdbf568771b4f43abb75027d2432c368d670ff4889e",
}
DEFAULT_SIZE = 500                       # the study's GSM8K run size
SUFFIX = " Give the result as your final answer. Do not include units."   # as reasoning-gym appends


@lru_cache(maxsize=1)
def _generators():
    import hashlib

    raw = cached_members("gsm-symbolic", SOURCE)
    for m, b in raw.items():  # never run cached code that is not byte for byte the pinned wheel's
        if hashlib.sha256(b).hexdigest() != MEMBER_SHA256[m]:
            raise WorkloadError(f"cached file {workload_dir('gsm-symbolic') / 'files' / m} does not match the "
                                f"sha256 pinned for reasoning-gym 0.1.25 (modified or corrupted cache); it was not "
                                f"run. Delete {workload_dir('gsm-symbolic')} to fetch it again")
    files = {m: b.decode() for m, b in raw.items()}
    utils: dict = {"__name__": "reasoning_gym_utils"}
    exec(compile(files["reasoning_gym/utils.py"], "reasoning_gym/utils.py", "exec"), utils)  # noqa: S102 (pinned wheel)
    gens = {}
    for part in ("generators_00_49.py", "generators_50_99.py"):
        src = files[_DIR + part].replace("from reasoning_gym.utils import format_number, is_integer\n", "")
        ns = {"__name__": f"gsm_symbolic_{part[:-3]}", "format_number": utils["format_number"],
              "is_integer": utils["is_integer"]}
        exec(compile(src, _DIR + part, "exec"), ns)  # noqa: S102 (pinned wheel)
        gens.update({int(k[len("generate_"):]): f for k, f in ns.items()
                     if re.fullmatch(r"generate_\d+", k)})
    tree = ast.parse(files[_DIR + "gsm_symbolic.py"])
    tasks_ok = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", None) == "tasks_ok")
    return gens, tasks_ok


def item(seed: int, idx: int) -> dict:
    """Record ``idx`` of the dataset seeded ``seed`` (``random.choices`` is prefix-stable, so the size of the
    dataset does not matter)."""
    gens, tasks_ok = _generators()
    task = Random(seed).choices(tasks_ok, k=idx + 1)[idx]
    ex = gens[task](Random(seed + idx), 1.0)
    return {"id": f"gsm-symbolic/s{seed}/{idx}", "messages": user_message(ex["question"] + SUFFIX),
            "meta": {"template": task, "answer": ex["answer"], "seed": seed, "index": idx}}
