"""Find and load ``mla_ops/_C``: ``csrc_meta/`` compiled by ``setup.py`` (schemas + Meta kernels).

The library is optional. It is skipped when ``MLA_OPS_NO_EXT`` is set (to anything but ``0``),
when it was not built (a source tree, a pure-Python install: the build recorded why in
``_C.status``), and, with a warning, when it does not load (built against another torch).
:mod:`mla_ops.library` then defines the ops in Python instead.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import warnings
from typing import Optional

import torch

__all__ = ["ENV_NO_EXT", "disabled", "library_path", "load", "status"]

ENV_NO_EXT = "MLA_OPS_NO_EXT"
PRELOADED = "<loaded before mla_ops was imported>"
_HERE = os.path.dirname(os.path.abspath(__file__))
_failure: Optional[str] = None  # why a built library did not load


def disabled() -> bool:
    """True when ``MLA_OPS_NO_EXT`` asks for the pure-Python registration."""
    return os.environ.get(ENV_NO_EXT, "0") not in ("", "0")


def library_path() -> Optional[str]:
    """The built ``_C`` library next to this file for this interpreter, or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(_HERE, "_C" + suffix))
        if found:
            return found[0]
    return None


def load() -> Optional[str]:
    """Load the C++ library once; return its path, or None for the pure-Python registration.

    If the ops already exist (a process that called ``torch.ops.load_library`` on ``_C``
    before importing mla_ops), they came from the C++ library: return :data:`PRELOADED`
    whatever ``MLA_OPS_NO_EXT`` says, since they cannot be defined a second time.
    """
    global _failure
    if hasattr(torch.ops.mla, "decode_verify"):
        path = library_path()
        loaded = {os.path.realpath(p) for p in torch.ops.loaded_libraries}
        return path if path is not None and os.path.realpath(path) in loaded else PRELOADED
    path = library_path()
    if disabled() or path is None:
        return None
    try:
        torch.ops.load_library(path)
    except OSError as e:  # e.g. undefined symbols: built against another torch
        _failure = str(e)
        warnings.warn(
            f"mla_ops: cannot load {path} ({e}); using the pure-Python registration of "
            f"torch.ops.mla. Rebuild it with `pip install --no-build-isolation -e .`, or set "
            f"{ENV_NO_EXT}=1 to skip it.", RuntimeWarning, stacklevel=3)
        return None
    return path


def status(loaded: Optional[str]) -> str:
    """One line: which side defined the ops, and why the C++ one did not."""
    if loaded is not None:
        return f"C++ schemas and Meta kernels from {loaded}"
    if disabled():
        return f"pure-Python registration ({ENV_NO_EXT} is set)"
    if _failure is not None:
        return f"pure-Python registration (mla_ops._C did not load: {_failure})"
    try:
        with open(os.path.join(_HERE, "_C.status")) as f:
            built = f.read().strip()
    except OSError:
        built = "no build record: installed without running setup.py's build_ext"
    return f"pure-Python registration (mla_ops._C not built: {built})"
