"""Pick the device for the suite: the GPU when there is one, else Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so this runs at collection,
before any test module imports mla_ops.

Every test must leave the process's global state (checked mode, ``MLA_OPS_*`` / ``TRITON_*``
variables, ``mock_platform``, the tuning tables) as it found it, or the next test runs under it:
a test that does not fails at teardown, naming what it changed, and the state is put back.
"""

import os

import pytest

try:
    import torch

    _HAS_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_GPU = False

if not _HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA/HIP GPU; skipped on CPU-only machines")
    config.addinivalue_line("markers", "slow: long-running; still part of the default run")


def pytest_report_header(config):
    """Which side defined torch.ops.mla, and why mla_ops._C was not built if it was not."""
    import mla_ops.library

    return f"mla_ops: {mla_ops.library.EXTENSION_STATUS}"


def pytest_collection_modifyitems(config, items):
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (this machine runs the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The device the kernels under test run on: cuda, or cpu under the interpreter."""
    return "cuda" if _HAS_GPU else "cpu"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _global_state():
    """What a test may change only for its own duration (compared with ==, put back by
    :func:`_restore`)."""
    from mla_ops import checked, platform, tuning

    return {
        "checked mode": checked.enabled(),
        "environment": {k: v for k, v in os.environ.items()
                        if k.startswith(("MLA_OPS_", "TRITON_"))},
        "mock_platform": platform._override,
        "tuning tables": {name: dict(k.builtin) for name, k in tuning.KERNELS.items()},
    }


def _restore(state):
    from mla_ops import checked, platform, tuning

    checked.set_checked_mode(state["checked mode"])
    for k in [k for k in os.environ if k.startswith(("MLA_OPS_", "TRITON_"))]:
        del os.environ[k]
    os.environ.update(state["environment"])
    platform._override = state["mock_platform"]
    for name, builtin in state["tuning tables"].items():
        tuning.KERNELS[name].builtin.clear()
        tuning.KERNELS[name].builtin.update(builtin)
    tuning.table.cache_clear()


@pytest.fixture(autouse=True)
def _leaves_global_state_alone():
    """Fail a test that leaves global state changed (the next test, in whatever order, would
    run under it), after putting the state back."""
    before = _global_state()
    yield
    after = _global_state()
    changed = [what for what in before if after[what] != before[what]]
    if changed:
        _restore(before)
        pytest.fail("the test left global state changed: " + "; ".join(
            f"{what}: {_change(before[what], after[what])}" for what in changed), pytrace=False)


def _change(before, after) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        return ", ".join(f"{k}: {_change(before.get(k), after.get(k))}"
                         for k in sorted(before.keys() | after.keys(), key=str)
                         if before.get(k) != after.get(k))
    short = [r if len(r) <= 80 else r[:77] + "..." for r in (repr(before), repr(after))]
    return " -> ".join(short)
