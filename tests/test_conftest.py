"""The suite's own machinery (conftest.py): the seeded test order, the interpreter's patch."""

from __future__ import annotations

import os
import types

import pytest
import triton
import triton.language as tl

from conftest import _order_seed, _shuffle


def _items():
    return [types.SimpleNamespace(nodeid=f"tests/test_{m}.py::test_{i}")
            for m in "abcd" for i in range(5)]


def _module(item):
    return item.nodeid.split("::")[0]


def test_shuffle_is_the_seeds_and_keeps_modules_together():
    orders = {}
    for seed in (1, 1, 2):
        items = _items()
        _shuffle(items, seed)
        assert sorted(i.nodeid for i in items) == sorted(i.nodeid for i in _items())
        modules = [_module(i) for i in items]
        runs = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
        assert len(runs) == len(set(runs)) == 4, "a module's tests are split"
        orders.setdefault(seed, []).append([i.nodeid for i in items])
    assert orders[1][0] == orders[1][1], "one seed, one order"
    assert orders[1][0] != orders[2][0]
    assert orders[1][0] != [i.nodeid for i in _items()]


@pytest.mark.parametrize("option,env,want", [
    (None, None, None), ("7", None, 7), (None, "8", 8), ("7", "8", 7), (None, "", None),
], ids=["off", "option", "env", "option-over-env", "empty-env"])
def test_order_seed_from_option_or_environment(monkeypatch, option, env, want):
    config = types.SimpleNamespace(getoption=lambda name: option)
    if env is None:
        monkeypatch.delenv("MLA_OPS_TEST_SEED", raising=False)
    else:
        monkeypatch.setenv("MLA_OPS_TEST_SEED", env)
    assert _order_seed(config) == want


def test_order_seed_random_and_bad(monkeypatch):
    # set, then removed: monkeypatch restores what was there, also when nothing was (the
    # random seed is exported for the xdist workers)
    monkeypatch.setenv("MLA_OPS_TEST_SEED", "0")
    monkeypatch.delenv("MLA_OPS_TEST_SEED")
    assert isinstance(_order_seed(types.SimpleNamespace(getoption=lambda name: "random")), int)
    with pytest.raises(pytest.UsageError, match="expected an integer or 'random', got 'x'"):
        _order_seed(types.SimpleNamespace(getoption=lambda name: "x"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's patch (CPU runs)")
def test_interpreter_patches_the_language_once_per_launch_and_still_restores_it():
    """conftest's ``_patch_lang_once_per_launch``: helpers called program after program compute
    what they should, launch after launch, and the language is put back after each launch."""
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "once_per_launch", False)
    for n, scale in ((37, 2.0), (64, -3.0)):
        x = torch.randn(n)
        out = torch.full_like(x, float("nan"))
        _scaled_square[(triton.cdiv(n, 16),)](x, out, n, scale, BLOCK=16)
        torch.testing.assert_close(out, scale * x * x + 1.0)
        assert tl.core.is_builtin(tl.arange) and tl.core.is_builtin(tl.load), "the launch left tl patched"


@triton.jit
def _square(v):
    return v * v


@triton.jit
def _plus_one(v):
    return v + 1.0


@triton.jit
def _scaled_square(X, Out, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Out + offs, _plus_one(scale * _square(x)), mask=offs < n)
