"""Eager launches at the cost of a launch: a public call is recorded once through the full
Python path (checks, config selection, Triton's JIT dispatch) and replayed afterwards.

A public launcher decorated with :func:`recorded` keys each call on everything that can change
what runs, other than the contents of its tensors and the addresses that Triton does not
specialize on (the *geometry*): for every argument its value, or for a tensor its dtype,
shape, strides, device and address modulo 64 (every alignment a launcher or Triton tests), and
which arguments are the same tensor; plus the launch tables' generation and the platform in force. A key seen before
replays the launches the first call made — the same compiled kernels (Triton's
``CompiledKernel`` objects, returned by its own dispatch), grids and scalar arguments — with
the call's tensors in their places, through the kernel's own launcher. A key not seen runs the
whole path, which records it.

Why a replay is the launch the full path would make: the argument checks, the config the
table selects, the support checks of the Gluon families, the grid and every integer argument
(strides, sizes, counts) are functions of the geometry; Triton's specialization key is a
function of the integer arguments, the dtypes and the pointers' alignment to 16 bytes, all in
the geometry. Tensors made inside a launcher (a scratch copy) cannot be replayed: such a call
is never recorded and always takes the full path. Data-dependent work is never skipped:
checked mode (which reads the data) turns replays off.

Replays run only where they were checked on a GPU (CUDA, :data:`CHECKED_TRITON`), without
Triton's launch hooks (a profiler's), and not when ``MLA_OPS_TRITON_DISPATCH=1`` asks for the
full path on every call (an A/B, or a suspicion). :func:`status` says which and why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable

import torch
import triton

__all__ = ["CHECKED_TRITON", "ENV_OFF", "launch", "recorded", "record_of", "status", "clear",
           "persistent"]

CHECKED_TRITON = ("3.6",)  # the launcher ABI the replay uses was checked on the H200 with these
ENV_OFF = "MLA_OPS_TRITON_DISPATCH"

_MAX_RECORDS = 4096  # a bound on distinct geometries (a cross-layer cache: one per layer view)
_RECORDS: dict[tuple, "_Record | None"] = {}
_PERSISTENT: dict[int, torch.Tensor] = {}  # id -> tensor: launcher-owned, never freed
_local = threading.local()
_generation = [0]
_REPLAY_DEVICES = ("cuda",)
_MISSING = object()  # an argument the call left to its default  # device types replayed (the tests' fake dispatch adds "cpu")


def clear() -> None:
    """Forget every recorded call (the launch tables changed: the same geometry may now run
    another config)."""
    _generation[0] += 1
    _RECORDS.clear()


def persistent(t: torch.Tensor) -> torch.Tensor:
    """Mark a tensor that a launcher made once and keeps (a default scale per device): a replay
    may pass it again. Returns ``t``."""
    _PERSISTENT[id(t)] = t
    return t


@functools.lru_cache(maxsize=1)
def _static_reason() -> str | None:
    minor = ".".join(triton.__version__.split(".")[:2])
    if minor not in CHECKED_TRITON:
        return (f"triton {triton.__version__}: replays were checked on a GPU with triton "
                f"{', '.join(CHECKED_TRITON)} only")
    if torch.version.hip is not None:
        return "HIP: replays were checked on CUDA only"
    return None


def status() -> str | None:
    """None when calls are replayed here, else why every call takes the full Python path."""
    if _environ.get(ENV_OFF, "0") not in ("", "0"):
        return f"{ENV_OFF} is set"
    why = _static_reason()
    if why is not None:
        return why
    runtime = _knobs_runtime()
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # triton 3.6: a HookChain
            return "triton launch hooks are set (a profiler's)"
    return None


_environ = os.environ


@functools.lru_cache(maxsize=1)
def _knobs_runtime():
    from triton import knobs

    return knobs.runtime


# --- recording ---------------------------------------------------------------------------------


def launch(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``, and its record when a call is being recorded. Every
    launcher launches through this."""
    kernel = fn[grid](*args, **kwargs)
    calls = getattr(_local, "calls", None)
    if calls is not None:
        calls.append((fn, kernel, grid, args, kwargs))


@contextlib.contextmanager
def _recording():
    _local.calls = calls = []
    try:
        yield calls
    finally:
        _local.calls = None


def _fact(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.shape, v.stride(), v.device, v.data_ptr() & 63)
    if isinstance(v, (list, tuple)):
        return tuple(_fact(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _fact(x)) for k, x in v.items()))
    return (type(v), v)  # 1 and True and 1.0 are different arguments


_Tensor = torch.Tensor
_SCALARS = (int, float, bool, type(None))


def _key(op: str, values: tuple, plat) -> tuple | None:
    """The geometry of a call (module docstring): per value its facts, and for a tensor the
    position of the first value that is the same tensor (aliasing); None where a value is a
    tensor subclass, whose metadata and address this key does not vouch for."""
    facts = [op, _generation[0], plat]
    first: dict[int, int] = {}
    for i, v in enumerate(values):
        t = type(v)
        if t is _Tensor:
            facts += (v.dtype, v.shape, v.stride(), v.device, v.data_ptr() & 63,
                      first.setdefault(id(v), i))
        elif t in _SCALARS:
            facts += (t, v)
        elif isinstance(v, _Tensor):
            return None
        else:
            facts.append(_fact(v))
    return tuple(facts)


class _Unrecordable(Exception):
    pass


def _slot(value: Any, names: dict[int, int]) -> tuple:
    """How a replay finds a recorded launch argument: a call argument (by position), a TMA
    descriptor over one, or a constant."""
    if isinstance(value, torch.Tensor):
        if id(value) in names:
            return ("arg", names[id(value)])
        if id(value) in _PERSISTENT:
            return ("const", value)
        raise _Unrecordable("a tensor made inside the launcher")
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(value, "block_shape"):
        if id(base) not in names:
            raise _Unrecordable("a descriptor over a tensor made inside the launcher")
        return ("desc", names[id(base)], list(value.shape), list(value.strides),
                getattr(value, "padding", "zero"))
    return ("const", value)


class _Descriptor:
    """What Triton's launcher reads of a host TMA descriptor argument (its base's address,
    shape, strides and padding; the box and layout are the compiled kernel's): the recorded
    descriptor over the call's tensor, without rebuilding and re-validating it."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base, shape, strides, padding):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


class _Launch:
    __slots__ = ("kernel", "grid", "slots", "direct")

    def __init__(self, fn, kernel, grid, args, kwargs, names):
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            raise _Unrecordable("the dispatch returned no compiled kernel")
        self.kernel, self.grid = kernel, tuple(grid) + (1,) * (3 - len(grid))
        params = fn.params
        full = []
        for i, p in enumerate(params):
            if i < len(args):
                full.append(args[i])
            elif p.name in kwargs:
                full.append(kwargs[p.name])
            else:
                full.append(p.default)
        self.slots = [_slot(v, names) for v in full]
        self.direct = _direct_launch(kernel, self.grid, self.slots)

    def run(self, values: tuple, stream: int) -> None:
        if self.direct is not None:
            self.direct(values, stream)
            return
        k = self.kernel
        k.run(*self.grid, stream, k.function, k.packed_metadata, None, None, None,
              *[_fill(s, values) for s in self.slots])


def _direct_launch(kernel, grid: tuple, slots: list) -> Callable | None:
    """A function ``(values, stream)`` that calls the C launch function Triton 3.6 compiled
    for ``kernel`` directly, with the arguments its ``CudaLauncher`` would pass: tensors as
    their addresses (checked CUDA tensors: the C side then skips its per-pointer driver query),
    constants as recorded, and each host TMA descriptor encoded once per base address (the
    encoding depends on nothing else the key does not fix). None where the launcher is not the
    one this was written for, or needs per-launch scratch memory: the kernel's own ``run``."""
    launcher = getattr(kernel, "run", None)
    if type(launcher).__name__ != "CudaLauncher" or launcher.global_scratch_size \
            or launcher.profile_scratch_size or getattr(launcher, "num_ctas", 1) != 1:
        return None
    launch, td_indices, td_meta = launcher.launch, (), ()
    if getattr(launch, "__closure__", None):  # wrap_handle_tensordesc's inner(*args)
        cells = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__)))
        if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(cells):
            return None
        launch, td_indices, td_meta = (cells["launcher"], cells["tensordesc_indices"],
                                       list(cells["tensordesc_meta"]))
    parts, consts, tmaps = [], [], []
    for i, s in enumerate(slots):
        if i in td_indices:
            meta = td_meta[len(tmaps)]
            if s[0] != "desc" or (meta is not None and meta.get("fp4_padded")):
                return None
            _, arg, shape, strides, padding = s
            tmaps.append((meta, shape, strides, padding))
            dims = [*map(repr, shape), *map(repr, strides)]
            if meta is None:
                parts += [f"v[{arg}].data_ptr()", *dims, repr(padding == "nan"), *dims]
            else:
                parts += [f"tm({len(tmaps) - 1}, v[{arg}])", *dims]
        elif s[0] == "arg":
            parts.append(f"v[{s[1]}].data_ptr()")
        elif s[0] == "const":
            consts.append(s[1])
            parts.append(f"c[{len(consts) - 1}]")
        else:
            return None
    encoded: dict[tuple, Any] = {}

    def tm(j: int, t: torch.Tensor):
        ptr = t.data_ptr()
        m = encoded.get((j, ptr))
        if m is None:
            if len(encoded) >= 256:
                encoded.clear()
            meta, shape, strides, padding = tmaps[j]
            m = encoded[(j, ptr)] = _encode_tma(ptr, meta, shape, strides, padding)
        return m

    ns = {"_launch": launch, "c": consts, "tm": tm, "FUNC": kernel.function,
          "PACKED": kernel.packed_metadata, "COOP": launcher.launch_cooperative_grid,
          "PDL": launcher.launch_pdl, "G": grid}
    src = ("def run(v, stream):\n    _launch(G[0], G[1], G[2], stream, FUNC, COOP, PDL, None, "
           "None, PACKED, None, None, None, " + ", ".join(parts) + ")\n")
    exec(compile(src, f"<mla_ops.fastpath {kernel.name}>", "exec"), ns)
    return ns["run"]


def _encode_tma(ptr: int, meta: dict, shape: list, strides: list, padding: str):
    """The ``CUtensorMap`` Triton 3.6's launcher encodes for a host descriptor (its
    ``make_tensordesc_arg``)."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    from triton.runtime import driver

    return driver.active.utils.fill_tma_descriptor(
        ptr, meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
        meta["block_size"], shape, strides, 1 if padding == "nan" else 0)


class _Record:
    __slots__ = ("launches", "device", "tables")

    def __init__(self, calls, values: tuple, device: torch.device, tables: tuple):
        self.tables = tables  # the launch tables it was selected from (by identity)
        names = {}
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                names.setdefault(id(v), i)
        self.launches = [_Launch(fn, k, g, a, kw, names) for fn, k, g, a, kw in calls]
        self.device = device

    def replay(self, values: tuple) -> None:
        guard, stream = _device_and_stream(self.device)
        with guard:
            for ln in self.launches:
                ln.run(values, stream)


def _device_and_stream(device: torch.device):
    """(a context that makes ``device`` current if it is not, its current raw stream)."""
    index, current = device.index, torch.cuda.current_device()
    if index is None:
        index = current
    guard = torch.cuda.device(index) if index != current else contextlib.nullcontext()
    return guard, torch._C._cuda_getCurrentRawStream(index)


def _fill(slot: tuple, values: tuple) -> Any:
    kind = slot[0]
    if kind == "const":
        return slot[1]
    if kind == "arg":
        return values[slot[1]]
    _, i, shape, strides, padding = slot
    return _Descriptor(values[i], shape, strides, padding)


def _same_tables(recorded_from: tuple, in_force: tuple) -> bool:
    return all(a is b for a, b in zip(recorded_from, in_force))


def _device_of(values: tuple) -> torch.device | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None


@functools.lru_cache(maxsize=None)
def _absent(op: str) -> tuple:
    from .host import _op_args

    return (_MISSING,) * len(_op_args(op)) + (None,)


def _values(op: str, args: tuple, kwargs: dict) -> tuple:
    """A call's arguments in the op's order (absent ones as a marker), then its ``config=``."""
    if not kwargs:
        return args + _absent(op)[len(args):]
    from .host import _op_args

    names = _op_args(op)
    return (*args, *(kwargs.get(n, _MISSING) for n in names[len(args):]), kwargs.get("config"))


def record_of(op: str, *args, **kwargs) -> "_Record | None":
    """The record a call with these arguments would replay, or None (tests)."""
    from . import platform

    return _RECORDS.get(_key(op, _values(op, args, kwargs), platform.current()))


def recorded(op: str, tables: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorate the public launcher of ``mla::<op>`` (positional arguments in the op's order,
    keyword-only knobs after), whose configs come from the launch ``tables`` of these kernels:
    replay a recorded call of the same geometry, else run and record it (module docstring)."""
    from . import platform, tuning

    def wrap(launcher: Callable) -> Callable:
        @functools.wraps(launcher)
        def call(*args, **kwargs):
            device = _device_of(args)
            if device is None or device.type not in _REPLAY_DEVICES or status() is not None:
                return launcher(*args, **kwargs)
            from . import checked

            if checked.enabled():
                return launcher(*args, **kwargs)
            values = _values(op, args, kwargs)
            plat = platform.current()
            key = _key(op, values, plat)
            if key is None:  # a tensor subclass (a fake tensor has no address): never replayed
                return launcher(*args, **kwargs)
            in_force = tuple(tuning.table(name, plat.arch) for name in tables)
            record = _RECORDS.get(key, _MISSING)
            if record is not _MISSING and record is not None:
                if _same_tables(record.tables, in_force):
                    record.replay(values)
                    return None
                record = _MISSING  # a table was reloaded since: select again
            with _recording() as calls:
                out = launcher(*args, **kwargs)
            if record is _MISSING:
                if len(_RECORDS) >= _MAX_RECORDS:
                    _RECORDS.clear()
                try:
                    _RECORDS[key] = _Record(calls, values, device, in_force)
                except _Unrecordable:
                    _RECORDS[key] = None  # this geometry always takes the full path
            return out

        call.full_path = launcher  # the unrecorded launcher (tests, A/B)
        return call

    return wrap

