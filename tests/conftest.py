"""Pick the device for the suite: the GPU when there is one, else Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, so this runs at collection,
before any test module imports mla_ops.

Two guards against tests that depend on their order:

* every test must leave the process's global state (checked mode, ``MLA_OPS_*`` / ``TRITON_*``
  variables, ``mock_platform``, the tuning tables) as it found it, or the next test runs under
  it: a test that does not fails at teardown, naming what it changed, and the state is put back;
* ``--random-order-seed=N`` (or ``MLA_OPS_TEST_SEED=N``; ``random`` picks one) runs the test
  modules, and the tests within each module, in an order shuffled by N, printed in the header
  so that a failing order can be replayed. Off by default: the collected order.
"""

import os
import random

import pytest

try:
    import torch

    _HAS_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_GPU = False

if not _HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_lang_once_per_launch():
    """Speed up Triton's interpreter (CPU runs) without changing what it computes.

    The interpreter patches ``triton.language`` for a launch (``_patch_lang``, undone by the
    returned scope at the launch's end) and then again at every call of a ``@triton.jit``
    helper inside it, program after program. Those repeated patches find the language already
    patched and change nothing, but each one walks the modules' members (``inspect.getmembers``):
    a third of a stage-2-heavy test's time. This keeps the first patch of a launch and skips a
    helper's when the same language modules are already patched by it; a helper that sees
    other modules is patched as before, and the launch's end clears the record. Triton 3.6 to
    3.9 have the same two call sites; on a triton without them this does nothing."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    orig, scope_cls = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if orig is None or scope_cls is None or getattr(orig, "once_per_launch", False):
        return
    state = {"launch": None, "patched": set()}
    keys = {}  # id of a function's globals -> the language modules among them

    def _patch_lang(fn):
        key = keys.get(id(fn.__globals__))
        if key is None:
            key = keys[id(fn.__globals__)] = frozenset(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        if state["launch"] is not None and key in state["patched"]:
            return scope_cls()  # nothing to undo: nothing was changed
        scope = orig(fn)
        if state["launch"] is None:  # the launch's own patch: its restore ends the launch
            state["launch"] = scope
            restore = scope.restore

            def _restore():
                try:
                    restore()
                finally:
                    state["launch"] = None
                    state["patched"].clear()

            scope.restore = _restore
        state["patched"].add(key)
        return scope

    _patch_lang.once_per_launch = True
    interpreter._patch_lang = _patch_lang


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_lang_once_per_launch()


SEED_ENV = "MLA_OPS_TEST_SEED"
_ORDER_SEED = pytest.StashKey[int | None]()


def pytest_addoption(parser):
    parser.addoption(
        "--random-order-seed", default=None, metavar="N",
        help=f"run the test modules, and the tests within each, in an order shuffled by N "
             f"('random': a new N each run; default ${SEED_ENV}, else the collected order)")


def _order_seed(config) -> int | None:
    value = config.getoption("--random-order-seed") or os.environ.get(SEED_ENV) or None
    if value is None:
        return None
    if value == "random":
        # Drawn once, by the process that starts pytest-xdist's workers (which inherit the
        # variable): every worker must collect the same order.
        seed = random.SystemRandom().randrange(10 ** 6)
        os.environ[SEED_ENV] = str(seed)
        return seed
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"--random-order-seed / {SEED_ENV}: expected an integer or "
                                f"'random', got {value!r}") from None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA/HIP GPU; skipped on CPU-only machines")
    config.addinivalue_line("markers", "slow: long-running; still part of the default run")
    config.stash[_ORDER_SEED] = _order_seed(config)


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
    """Which side defined torch.ops.mla, and why mla_ops._C was not built if it was not; the
    test order."""
    import mla_ops.library

    seed = config.stash[_ORDER_SEED]
    order = ("collected (shuffle with --random-order-seed=N)" if seed is None else
             f"shuffled by seed {seed} (replay: --random-order-seed={seed})")
    return [f"mla_ops: {mla_ops.library.EXTENSION_STATUS}", f"test order: {order}"]


def pytest_terminal_summary(terminalreporter, config):
    """The seed again at the end, where ``pytest -q`` (no header) shows it too."""
    seed = config.stash[_ORDER_SEED]
    if seed is not None:
        terminalreporter.write_line(f"test order shuffled by seed {seed} "
                                    f"(replay: --random-order-seed={seed})")


def _shuffle(items, seed):
    """Shuffle the modules, then the tests within each module, keeping a module's tests
    together (its module-scoped fixtures are set up once)."""
    rng = random.Random(seed)
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


def pytest_collection_modifyitems(config, items):
    seed = config.stash[_ORDER_SEED]
    if seed is not None:
        _shuffle(items, seed)
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


# TRITON_* variables torch's inductor sets for the whole process on its first compile (its
# cache folder and ptxas): not a test's state.
_PROCESS_WIDE = ("TRITON_CACHE_DIR", "TRITON_PTXAS_PATH")


def _tracked(name: str) -> bool:
    return name.startswith(("MLA_OPS_", "TRITON_")) and name not in _PROCESS_WIDE


def _global_state():
    """What a test may change only for its own duration (compared with ==, put back by
    :func:`_restore`)."""
    from mla_ops import checked, platform, tuning

    return {
        "checked mode": checked.enabled(),
        "environment": {k: v for k, v in os.environ.items() if _tracked(k)},
        "mock_platform": platform._override,
        "tuning tables": {name: dict(k.builtin) for name, k in tuning.KERNELS.items()},
    }


def _restore(state):
    from mla_ops import checked, platform, tuning

    checked.set_checked_mode(state["checked mode"])
    for k in [k for k in os.environ if _tracked(k)]:
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
