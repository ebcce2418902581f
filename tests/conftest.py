"""Pick the device for the suite: the GPU when there is one, else Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so this runs at collection,
before any test module imports mla_ops.
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


def pytest_sessionstart(session):
    """On a CPU machine every kernel test runs in Triton's interpreter: if it cannot run with the
    installed packages, say why once instead of failing a thousand tests."""
    if _HAS_GPU:
        return
    from mla_ops.platform import interpreter_problem

    why = interpreter_problem()
    if why is not None:
        pytest.exit(f"the Triton interpreter cannot run here: {why}", returncode=1)


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
