"""Launch tables of every kernel: one format, one loader, one selector, one override.

A kernel (``decode_verify``, ``prefill``) has, per architecture, a table: an ordered list of
rules. A launch describes itself by a few *facts* (the verify kernel: ``rows`` = batch * qlen *
heads, ``num_heads``, ``qlen``, ``cache``; the encoder kernel: ``head_dim``, ``split``,
``aligned``, ``causal``); the **first** rule whose ``match`` holds gives the config, laid over
the defaults of its kernel *family* (``"triton"``, the portable kernels; ``"gluon"``, the sm_90
kernels written in Triton's Gluon dialect). The last rule of a table matches everything.

Conditions of ``match`` (all must hold; any may be absent):

- ``"<fact>": value`` — equal; ``"<fact>": [v1, v2]`` — one of them;
- ``"<fact>_max": v`` / ``"<fact>_min": v`` — ``fact <= v`` / ``fact >= v``.

Tables are data: ``mla_ops/<kernel>/tables/<arch>.json`` (written by the sweeps in
``benchmarks/`` through :func:`format_table`), else a built-in table of the kernel, else its
``"default"`` one. A caller that wants another config passes ``config=`` (an argument, never
process state): :func:`select` lays it over the selection after the same validation.

Compiler bugs are worked around here too, keyed on the compiler (backend and triton version),
not on the GPU: :data:`WORKAROUNDS`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
from typing import Any, Callable, Iterable

from . import platform

__all__ = ["Kernel", "KERNELS", "register", "select", "table", "load_table", "validate",
           "format_table", "Workaround", "WORKAROUNDS", "workaround_active", "unchecked_workarounds",
           "triton_version"]

@dataclasses.dataclass
class Kernel:
    """What the tuning layer knows of one kernel: its families' default configs (the keys a
    config may set), the facts its rules may match, built-in tables, and the checks a config
    must pass (compiler workarounds) besides knowing its keys."""

    name: str
    defaults: dict[str, dict[str, Any]]  # family -> default config
    facts: tuple[str, ...]
    builtin: dict[str, dict[str, Any]]  # arch -> table ("default" required)
    table_dir: pathlib.Path
    extra_keys: tuple[str, ...] = ()  # keys any family accepts (HIP launch kwargs, ...)
    check_config: Callable[[dict[str, Any], str], None] | None = None  # (config, where)


KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    KERNELS[kernel.name] = kernel
    table.cache_clear()
    return kernel


# --- compiler workarounds -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workaround:
    """A compiler bug the launchers steer around, while the running compiler may have it.

    It applies on ``backend`` with any triton up to ``fixed_in`` (exclusive; None: not known to
    be fixed), so a newer triton keeps the safe path until someone checks. ``last_checked`` is
    the newest triton on which the bug was reproduced or the workaround re-verified;
    :func:`unchecked_workarounds` (printed by ``python -m mla_ops``) names those the running
    triton is newer than: re-run the GPU tests named in ``why`` there, then move
    ``last_checked`` or set ``fixed_in``.
    """

    backend: str  # "cuda" | "hip"
    last_checked: str
    fixed_in: str | None
    why: str


WORKAROUNDS = {
    "swap_ab_min_stages": Workaround(
        "cuda", "3.6.0", None,
        "the swap-AB verify loop unpipelined (num_stages 1) miscompiles: on the H200 it gave "
        "wrong results, a compile error or an illegal address depending on the tile"),
    "prefill_unaligned_copy": Workaround(
        "cuda", "3.6.0", None,
        "the encoder kernel without the 8-element head-stride hint (scalar loads, no cp.async "
        "pipelining) computed wrong tail lanes and once faulted on the H200: such views run on "
        "aligned copies"),
}


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def triton_version() -> tuple[int, ...]:
    import triton

    return _version_tuple(triton.__version__)


def unchecked_workarounds() -> list[str]:
    """The workarounds still applied on this triton although it is newer than the last one
    they were checked on (they stay on: the safe path; a GPU run decides whether to drop them)."""
    return [name for name, w in WORKAROUNDS.items()
            if (w.fixed_in is None or triton_version() < _version_tuple(w.fixed_in))
            and triton_version() > _version_tuple(w.last_checked)]


def workaround_active(name: str, plat: platform.Platform | None = None) -> bool:
    """True when the bug ``name`` may affect launches on ``plat`` (default: the current one)."""
    w = WORKAROUNDS[name]
    plat = plat or platform.current()
    on_backend = plat.is_hip if w.backend == "hip" else plat.is_cuda
    if not on_backend or plat.interpret:
        return False
    return w.fixed_in is None or triton_version() < _version_tuple(w.fixed_in)


# --- tables ---------------------------------------------------------------------------------


def _matches(match: dict[str, Any], facts: dict[str, Any]) -> bool:
    for key, want in match.items():
        if key.endswith("_max"):
            if facts[key[:-4]] > want:
                return False
        elif key.endswith("_min"):
            if facts[key[:-4]] < want:
                return False
        elif isinstance(want, list):
            if facts[key] not in want:
                return False
        elif facts[key] != want:
            return False
    return True


def _fact_of(key: str) -> str:
    return key[:-4] if key.endswith(("_max", "_min")) else key


def validate(kernel: Kernel, tbl: dict[str, Any]) -> None:
    """Raise ValueError for a table that names unknown keys or facts, has no catch-all last
    rule, or selects a config a compiler workaround forbids on its architecture."""
    where = f"{kernel.name} table {tbl.get('arch')!r}"
    rules = tbl.get("rules")
    if not rules:
        raise ValueError(f"{where}: no rules")
    if rules[-1].get("match"):
        raise ValueError(f"{where}: the last rule must match every launch")
    for i, rule in enumerate(rules):
        unknown = {_fact_of(k) for k in rule.get("match", {})} - set(kernel.facts)
        if unknown:
            raise ValueError(f"{where}, rule {i}: unknown facts {sorted(unknown)}")
        cfg = _over_defaults(kernel, rule["config"], f"{where}, rule {i}")
        if kernel.check_config is not None and str(tbl.get("arch", "")).startswith("sm_"):
            kernel.check_config(cfg, f"{where}, rule {i}")


def _over_defaults(kernel: Kernel, cfg: dict[str, Any], where: str) -> dict[str, Any]:
    family = cfg.get("family", "triton")
    if family not in kernel.defaults:
        raise ValueError(f"{where}: unknown kernel family {family!r} "
                         f"(this kernel has {sorted(kernel.defaults)})")
    base = kernel.defaults[family]
    unknown = set(cfg) - set(base) - set(kernel.extra_keys) - {"family"}
    if unknown:
        raise ValueError(f"{where}: unknown config keys {sorted(unknown)} for the {family} "
                         f"family")
    return {**base, "family": family, **cfg}


def load_table(kernel: Kernel, path: pathlib.Path) -> dict[str, Any]:
    with open(path) as f:
        tbl = json.load(f)
    validate(kernel, tbl)
    return tbl


def table(kernel_name: str, arch: str) -> dict[str, Any]:
    """The table of ``kernel`` for ``arch``: its JSON file, a built-in one, or the default.
    Read once; ``table.cache_clear()`` reads them again (and forgets recorded launches)."""
    return _table(kernel_name, arch)


def _clear_tables() -> None:
    _table.cache_clear()
    fastpath = sys.modules.get(__package__ + ".fastpath")
    if fastpath is not None:
        fastpath.selection_changed()  # the C++ replays keep no table: they forget what they selected


table.cache_clear = _clear_tables


@functools.lru_cache(maxsize=None)
def _table(kernel_name: str, arch: str) -> dict[str, Any]:
    kernel = KERNELS[kernel_name]
    path = kernel.table_dir / f"{arch}.json"
    if path.exists():
        return load_table(kernel, path)
    tbl = kernel.builtin.get(arch, kernel.builtin["default"])
    validate(kernel, tbl)
    return tbl


# (kernel, arch, facts) -> (the table, the config its first matching rule gives): an eager
# launch selects on every call, and a scan of a swept table costs ~10 µs of host time. Keyed
# on the table object too, so a reloaded table (``table.cache_clear()``) is scanned afresh.
_SELECTED: dict[tuple, tuple[dict, dict]] = {}
_SELECTED_MAX = 4096


def _table_config(kernel: Kernel, tbl: dict[str, Any], arch: str,
                  facts: dict[str, Any]) -> dict[str, Any]:
    key = (kernel.name, arch, tuple(facts.items()))
    hit = _SELECTED.get(key)
    if hit is not None and hit[0] is tbl:
        return hit[1]
    cfg = next(_over_defaults(kernel, rule["config"], kernel.name) for rule in tbl["rules"]
               if _matches(rule.get("match", {}), facts))
    if len(_SELECTED) >= _SELECTED_MAX:
        _SELECTED.clear()
    _SELECTED[key] = (tbl, cfg)
    return cfg


def select(kernel_name: str, facts: dict[str, Any], *, config: dict[str, Any] | None = None,
           arch: str | None = None) -> dict[str, Any]:
    """The config for a launch with ``facts`` on ``arch`` (default: the current platform's),
    with ``config`` laid over it. Returns a fresh dict that always has ``"family"``."""
    kernel = KERNELS[kernel_name]
    arch = arch or platform.current().arch
    cfg = dict(_table_config(kernel, table(kernel_name, arch), arch, facts))
    if config:
        if "family" in config and config["family"] != cfg["family"]:
            cfg = {"family": config["family"]}  # another family: its own defaults
        cfg = _over_defaults(kernel, {**cfg, **config}, "config")
        if kernel.check_config is not None:
            kernel.check_config(cfg, "config")
    return cfg


def thresholds(kernel_name: str, fact: str, arch: str | None = None) -> list[Any]:
    """Every bound the current table puts on ``fact`` (``<fact>_max`` / ``_min`` values)."""
    tbl = table(kernel_name, arch or platform.current().arch)
    out = set()
    for rule in tbl["rules"]:
        for key, value in rule.get("match", {}).items():
            if key in (f"{fact}_max", f"{fact}_min"):
                out.add(value)
    return sorted(out)


def format_table(kernel_name: str, arch: str, rules: Iterable[dict[str, Any]], source: str,
                 env: dict[str, Any] | None = None) -> str:
    """A table as the sweeps write it: validated JSON, one line per rule's match and config
    (diffable), any measurement a rule carries kept beside it."""
    tbl = {"kernel": kernel_name, "arch": arch, "source": source, "env": env or {},
           "rules": list(rules)}
    validate(KERNELS[kernel_name], tbl)
    lines = []
    for rule in tbl["rules"]:
        parts = [f'"{k}": {json.dumps(v, separators=(", ", ": "))}' for k, v in rule.items()]
        lines.append("    {" + ", ".join(parts) + "}")
    head = {k: tbl[k] for k in ("kernel", "arch", "source", "env")}
    body = json.dumps(head, indent=1)[:-2]
    return body + ',\n "rules": [\n' + ",\n".join(lines) + "\n ]\n}\n"
