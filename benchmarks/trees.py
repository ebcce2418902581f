"""A second copy of ``mla_ops`` in this process, from another source tree, for an A/B of two
versions of the code in one process (``ab_tree.py``): the same machine state, the same inputs,
interleaved timings. Two processes running the same code differ by up to 2% on the H200, more
than the differences such an A/B is asked to resolve.

:func:`load` imports ``<tree>/mla_ops`` as the package ``name`` (``mla_ops_ab_base``, say). The
package imports itself relatively throughout (``from .. import``; only ``__main__`` names
``mla_ops``, and it is never imported), so every module of the copy is the copy's own: its
kernels, launchers, tables, platform and checked-mode state. Its ``library`` module, which
registers ``torch.ops.mla`` (and loads ``_C``), is replaced by a stub before the package runs:
``torch.ops.mla`` stays the current package's, and the copy is called through its public Python
functions (``decode_attention_fwd_verify``, ``context_attention_fwd``), which launch its own
kernels. The ops themselves (and ``plan.run``, which calls them) would run the current code.
Triton keys compiled kernels on their source, so the copy's kernels compile (and cache on disk)
apart from the current ones where their sources differ, and share binaries where they do not.

The compile jobs below (module-level, picklable by name) let the compile pool fill Triton's
disk cache for either copy in worker processes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import pathlib
import sys
from types import ModuleType

PACKAGE = "mla_ops"
ROOT = pathlib.Path(__file__).resolve().parent.parent  # this checkout: the current tree
STUB_STATUS = "not registered: a second copy of mla_ops for an in-process A/B (benchmarks/trees.py)"


def package_dir(tree: str | os.PathLike) -> pathlib.Path:
    """``<tree>/mla_ops``, checked to be a package."""
    pkg = pathlib.Path(tree).resolve() / PACKAGE
    if not (pkg / "__init__.py").is_file():
        raise FileNotFoundError(f"{tree}: no {PACKAGE}/__init__.py (expected a source tree, e.g. "
                                f"a copy of an older commit's mla_ops/ under .ab_base/)")
    return pkg


def _library_stub(name: str) -> ModuleType:
    stub = ModuleType(f"{name}.library", "The copy's op registration, stubbed: torch.ops.mla is "
                      "the current package's (benchmarks/trees.py).")
    stub.EXTENSION = None
    stub.EXTENSION_STATUS = STUB_STATUS
    stub.STUB = True
    return stub


def unload(name: str) -> None:
    """Forget the copy loaded as ``name`` (its modules leave ``sys.modules``)."""
    if name == PACKAGE:
        raise ValueError(f"{PACKAGE} itself is not a copy")
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def load(tree: str | os.PathLike | None, name: str = "mla_ops_ab_base") -> ModuleType:
    """The package of ``tree`` imported as ``name``, its op registration stubbed out; ``tree``
    None is the current package itself (``import mla_ops``, which registers the ops). Loading
    the same tree under the same name again returns the module already loaded."""
    if tree is None:
        return importlib.import_module(PACKAGE)
    if name == PACKAGE or name.startswith(PACKAGE + ".") or not name.isidentifier():
        raise ValueError(f"name: a package name other than {PACKAGE!r}, got {name!r}")
    pkg = package_dir(tree)
    if name in sys.modules:
        mod = sys.modules[name]
        if [str(pathlib.Path(p).resolve()) for p in getattr(mod, "__path__", [])] != [str(pkg)]:
            raise ValueError(f"{name} is already loaded from {getattr(mod, '__path__', None)}, "
                             f"not {pkg}")
        return mod
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    stub = _library_stub(name)
    sys.modules[name] = mod
    sys.modules[stub.__name__] = stub
    mod.library = stub
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        unload(name)
        raise
    foreign = {m: getattr(v, "__file__", None) for m, v in sys.modules.items()
               if m.startswith(name + ".") and getattr(v, "__file__", None)
               and not pathlib.Path(v.__file__).resolve().is_relative_to(pkg)}
    if foreign:
        unload(name)
        raise ImportError(f"{name}: modules loaded from outside {pkg}: {foreign}")
    return mod


def tree_hash(tree: str | os.PathLike) -> str:
    """12 hex digits of SHA-256 over the tree's ``mla_ops`` sources and tables (``*.py``,
    ``*.json``, by relative path): which code a side ran, where the copy has no ``.git``."""
    pkg = package_dir(tree)
    h = hashlib.sha256()
    files = sorted(p for p in pkg.rglob("*") if p.suffix in (".py", ".json")
                   and "__pycache__" not in p.parts)
    for p in files:
        h.update(str(p.relative_to(pkg)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def describe(mod: ModuleType, tree: str | os.PathLike | None) -> dict:
    """What a JSON row needs to say which code a side ran."""
    root = ROOT if tree is None else pathlib.Path(tree).resolve()
    return {"package": mod.__name__, "tree": str(root), "file": mod.__file__,
            "sources_sha256": tree_hash(root),
            "registers_ops": not getattr(getattr(mod, "library", None), "STUB", False)}


# --- one launch of each family, through the public functions both versions have ---------------

def decode_launch(mod: ModuleType, case, act, device: str) -> tuple[dict, int]:
    """``(config, num_kv_splits)`` a serving caller of ``mod`` runs ``case`` with: the config
    its table selects (its ``launch_config``), the split cap of ``verify_num_kv_splits`` for it
    (what its ``plan_verify`` computes)."""
    import torch

    from benchmarks.shapes import LK, LV

    probe = torch.empty(0, 1, LK, device=device,
                        dtype=torch.float8_e4m3fn if case.fp8 else act)
    cfg = dict(mod.decode_verify.launch.launch_config(
        case.B, case.qlen, case.H, probe, LV, None, q_dtype=act, page_size=case.page_size))
    splits = mod.verify_num_kv_splits(case.L, case.B, case.qlen, case.H,
                                      mod.platform.current().sm_count,
                                      block_h=cfg.get("BLOCK_H"),
                                      min_work_per_split=cfg.get("SPLIT_WORK"),
                                      balance=cfg.get("BALANCE", 0))
    return cfg, splits


def decode_call(mod: ModuleType, inp, qlen: int, splits: int, sm_scale: float, page_size: int,
                o, lse, attn_logits):
    """``fn()``: ``mod.decode_attention_fwd_verify`` on ``inp``'s first cache copy, into
    ``o`` / ``lse``."""
    from benchmarks.shapes import LV

    f, kv = mod.decode_attention_fwd_verify, inp.kv[0]
    v = kv[..., :LV]

    def fn():
        f(inp.q, kv, v, o, lse, inp.req_to_token, inp.seq_lens, None, qlen, attn_logits, splits,
          sm_scale, page_size, inp.k_scale)

    return fn


def prefill_call(mod: ModuleType, inputs, o, seq: int, causal: bool):
    """``fn()``: ``mod.context_attention_fwd`` on ``inputs`` (``prefill.make_inputs``) into
    ``o``."""
    q, k, v, _o, b_start, b_len = inputs
    f = mod.context_attention_fwd

    def fn():
        f(q, k, v, o, b_start, b_len, seq, causal)

    return fn


# --- compile jobs (the compile pool's workers fill Triton's disk cache) --------------------------

def compile_job(spec: dict) -> None:
    """One launch of one side: ``spec`` from :func:`decode_spec` or :func:`prefill_spec`."""
    import torch

    from benchmarks import decode, prefill
    from benchmarks.shapes import DEFAULT_SM_SCALE, LV, Case

    mod = load(spec["tree"], spec["name"])
    dev = spec.get("device", "cuda")
    if spec["family"] == "decode":
        case = Case(spec["H"], spec["qlen"], spec["B"], spec["L"], spec["fp8"], spec["page_size"])
        inp = decode.make_inputs(case, dev, decode.DTYPES[spec["act"]])
        inp.seq_lens.clamp_(max=4 * case.page_size)  # lengths are not specialized on
        splits = spec["splits"]
        logits = None if splits == 1 else torch.empty(
            inp.q.shape[0], case.H, splits, LV + 1, dtype=torch.float32, device=dev)
        decode_call(mod, inp, case.qlen, splits, DEFAULT_SM_SCALE, case.page_size, inp.o,
                    inp.lse, logits)()
    else:
        b, s, h, d = spec["shape"]
        inputs = prefill.make_inputs(b, s, h, d, prefill.DTYPES[spec["act"]], dev)
        prefill_call(mod, inputs, inputs[3], s, spec["causal"])()


def decode_spec(side_tree: str | None, side_name: str, case, act: str, splits: int,
                cfg: dict, device: str = "cuda", sources: str | None = None) -> tuple[tuple, dict]:
    """``(key, spec)`` of a decode compile job: the key is the side's sources (``sources``,
    e.g. :func:`tree_hash`, else its name: Triton keys its cache on a kernel's source, not its
    module) and what Triton specializes the launch on (config, shape constants, whether the
    block table's width is a multiple of 16, one split or several), so that points and sides
    sharing a binary compile it once."""
    pages = math.ceil(case.L / case.page_size)
    key = ("decode", sources or side_name, case.H, case.qlen, case.fp8, case.page_size,
           pages % 16 == 0, act, splits == 1, tuple(sorted((k, str(v)) for k, v in cfg.items())))
    spec = {"family": "decode", "tree": side_tree, "name": side_name, "H": case.H,
            "qlen": case.qlen, "B": case.B, "L": case.L, "fp8": case.fp8,
            "page_size": case.page_size, "act": act, "splits": splits, "device": device}
    return key, spec


def prefill_spec(side_tree: str | None, side_name: str, shape: tuple, causal: bool, act: str,
                 device: str = "cuda", sources: str | None = None) -> tuple[tuple, dict]:
    """``(key, spec)`` of an encoder compile job (the shape itself: one launch per shape)."""
    key = ("prefill", sources or side_name, tuple(shape), causal, act)
    return key, {"family": "prefill", "tree": side_tree, "name": side_name,
                 "shape": list(shape), "causal": causal, "act": act, "device": device}
