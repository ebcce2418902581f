"""Find and load ``mla_ops/_C``: ``csrc_meta/`` compiled by ``setup.py`` (schemas + Meta kernels).

The library is optional. It is skipped when ``MLA_OPS_NO_EXT`` is set (to anything but ``0``),
when it was not built (a source tree, a pure-Python install), and, with a warning, when it
does not load (built against another torch). :mod:`mla_ops.library` then defines the ops in
Python instead.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import warnings
from typing import Optional

import torch

__all__ = ["ENV_NO_EXT", "disabled", "library_path", "load"]

ENV_NO_EXT = "MLA_OPS_NO_EXT"
_PROBE = ("mla", "decode_verify")  # an op only the mla library defines
PRELOADED = "<loaded before mla_ops was imported>"


def disabled() -> bool:
    """True when ``MLA_OPS_NO_EXT`` asks for the pure-Python registration."""
    return os.environ.get(ENV_NO_EXT, "0") not in ("", "0")


def library_path() -> Optional[str]:
    """The built ``_C`` library next to this file for this interpreter, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(here, "_C" + suffix))
        if found:
            return found[0]
    return None


def _ops_defined() -> bool:
    ns, name = _PROBE
    return hasattr(getattr(torch.ops, ns), name)


def load() -> Optional[str]:
    """Load the C++ library once; return its path, or None for the pure-Python registration.

    If the ops already exist (a process that called ``torch.ops.load_library`` on ``_C``
    before importing mla_ops), they came from the C++ library: return :data:`PRELOADED`
    whatever ``MLA_OPS_NO_EXT`` says, since they cannot be defined a second time.
    """
    if _ops_defined():
        path = library_path()
        loaded = {os.path.realpath(p) for p in torch.ops.loaded_libraries}
        return path if path is not None and os.path.realpath(path) in loaded else PRELOADED
    if disabled():
        return None
    path = library_path()
    if path is None:
        return None
    try:
        torch.ops.load_library(path)
    except OSError as e:  # e.g. undefined symbols: built against another torch
        warnings.warn(
            f"mla_ops: cannot load {path} ({e}); using the pure-Python registration of "
            f"torch.ops.mla. Rebuild it with `pip install --no-build-isolation -e .`, or set "
            f"{ENV_NO_EXT}=1 to skip it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return path
