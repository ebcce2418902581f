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

Where ``mla_ops._C`` is loaded, replays run below Python: the C++ library's BackendSelect
kernel of each op keys the call and launches the recorded kernels with the CUDA driver
(``csrc_meta/mla_replay.cpp``); a key it has not seen reaches the op's Python device kernel,
which records the call here and commits the record to it (:func:`_program` says what a
launch's parameters are). The public functions then call the op. Without ``_C`` this module
replays from Python, through Triton's compiled launcher.

Replays run only where they were checked on a GPU (CUDA, :data:`CHECKED_TRITON`), without
Triton's launch hooks (a profiler's), and not when ``MLA_OPS_TRITON_DISPATCH=1`` asks for the
full path on every call (an A/B, or a suspicion), nor in checked mode. :func:`status` says
which and why, :func:`path` which launch path runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from typing import Any, Callable

import torch
import triton

__all__ = ["CHECKED_TRITON", "ENV_OFF", "launch", "recorded", "record_of", "status", "clear",
           "persistent", "path", "sync", "cpp_stats"]

CHECKED_TRITON = ("3.6",)  # the launcher ABI the replay uses was checked on the H200 with these
ENV_OFF = "MLA_OPS_TRITON_DISPATCH"

_MAX_RECORDS = 4096  # a bound on distinct geometries (a cross-layer cache: one per layer view)
_RECORDS: dict[tuple, "_Record | None"] = {}
_PERSISTENT: dict[int, torch.Tensor] = {}  # id -> tensor: launcher-owned, never freed
_local = threading.local()
_generation = [0]
_REPLAY_DEVICES = ("cuda",)  # device types replayed (the tests' fake dispatch adds "cpu")
_MISSING = object()  # an argument the call left to its default


def clear() -> None:
    """Forget every recorded call (the launch tables or the platform changed: the same
    geometry may now run another config)."""
    _generation[0] += 1
    _RECORDS.clear()
    selection_changed()


def selection_changed() -> None:
    """The platform or the launch tables changed: the C++ replays forget their records (they
    keep neither; the Python ones key on the platform and check the tables they came from)."""
    cpp = _cpp() if _cpp_module else None  # never the first to load the library
    if cpp is not None:
        cpp.clear()
        sync()


# --- the C++ replays (mla_ops._C) --------------------------------------------------------------

_cpp_module: list = []  # [module or None], resolved once


def _cpp():
    """``mla_ops._C`` when the C++ library is loaded (it replays), else None."""
    if not _cpp_module:
        module = None
        from . import library

        if library.EXTENSION is not None:
            import importlib

            try:
                module = importlib.import_module("mla_ops._C")
            except ImportError:
                module = None
            if module is not None and not hasattr(module, "commit"):
                module = None  # a library built before the replays existed
        _cpp_module.append(module)
    return _cpp_module[0]


def _hook_lists() -> tuple:
    """The lists of Triton's launch hook chains (triton 3.6: ``HookChain.calls``), which the C++
    replays read on every call."""
    runtime = _knobs_runtime()
    lists = tuple(getattr(h, "calls", None) for h in (runtime.launch_enter_hook,
                                                      runtime.launch_exit_hook))
    return lists if all(isinstance(x, list) for x in lists) else ()


def _cpp_allowed() -> bool:
    """Whether C++ replays may run now, as far as Python decides (the C++ side also reads
    ``MLA_OPS_TRITON_DISPATCH`` and the hook lists on every call)."""
    from . import checked

    return _static_reason() is None and not checked.enabled() and bool(_hook_lists())


def sync() -> None:
    """Tell the C++ replays what changed on the Python side (checked mode switched, the
    platform or the tables changed). Called by those switches; cheap."""
    cpp = _cpp()
    if cpp is not None:
        cpp.set_state(_cpp_allowed(), _hook_lists() if _static_reason() is None else (),
                      *_cpp_test_mode)


_cpp_test_mode: tuple = ()  # tests: (dry_run, replay_cpu)


def cpp_stats() -> dict | None:
    """The C++ replays' counters (hits, misses, commits, records), or None without them."""
    cpp = _cpp()
    return None if cpp is None else cpp.stats()


def path(device_type: str = "cuda") -> str:
    """Which launch path an eager call on ``device_type`` tensors takes, and why."""
    if device_type != "cuda":
        return "the full Python path (CPU tensors: no launch to replay)"
    why = status()
    if why is not None:
        return f"the full Python path on every call ({why})"
    if _cpp() is not None:
        return ("C++ replays after the first call of each geometry (mla_ops._C: the ops' "
                "BackendSelect kernel launches the recorded kernels)")
    from . import library

    return ("Python replays after the first call of each geometry (mla_ops.fastpath; "
            f"mla_ops._C would replay below Python: {library.EXTENSION_STATUS})")


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
# Per schema type, the Python types a public call may hand the op as they are: those the
# dispatcher converts exactly as the Python checks would accept them. Anything else (a float
# where an int goes, an int where a bool goes, a list where a tensor goes) takes the Python
# path, whose checks name the argument; the dispatcher would refuse it without the name as a
# RuntimeError, or take 1 for True.
_ROUTED = {"Tensor": frozenset((_Tensor,)), "int": frozenset((int,)),
           "float": frozenset((float, int)), "bool": frozenset((bool,))}


@functools.lru_cache(maxsize=None)
def _routed_types(op: str) -> dict[str, frozenset]:
    """Argument name of ``mla::<op>`` -> the Python types its C++ route takes (``_ROUTED``;
    a ``T?`` adds None, a list type takes nothing), in the schema's order."""
    from .spec import OPS, parse_schema

    out = {}
    for arg in parse_schema(OPS[op].schema):
        types = _ROUTED.get(arg.type.rstrip("?"), frozenset())
        out[arg.name] = types | {type(None)} if arg.type.endswith("?") and types else types
    return out


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


def _scalar(ty: str, value: Any) -> tuple | None:
    """A constant parameter of Triton type ``ty`` as ``(1, size, bits)`` (the C++ record's
    form), or None for a type the C++ replay does not pack."""
    import struct

    if isinstance(value, bool) or isinstance(value, int):
        size = {"i1": 1, "i8": 1, "u1": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4,
                "i64": 8, "u64": 8}.get(ty)
        if size is not None:
            return (1, size, int(value) & ((1 << (8 * size)) - 1))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if ty in ("fp32", "f32"):
            return (1, 4, struct.unpack("<I", struct.pack("<f", value))[0])
        if ty == "fp64":
            return (1, 8, struct.unpack("<Q", struct.pack("<d", value))[0])
    return None


def _program_launch(ln: "_Launch") -> tuple | None:
    """One recorded launch in the C++ record's form (``csrc_meta/mla_replay.cpp``,
    ``parse_launch``): the parameters Triton 3.6's launcher passes to ``cuLaunchKernelEx``,
    in its order — every non-constexpr argument of the kernel's signature (a host TMA
    descriptor expanded as the launcher expands it), then the global and profile scratch
    addresses. None where a launch needs what the C++ replay does not do."""
    kernel = ln.kernel
    launcher = kernel.run
    if getattr(launcher, "profile_scratch_size", 0) or getattr(launcher, "num_ctas", 1) != 1:
        return None
    signature = getattr(getattr(kernel, "src", None), "signature", None)
    function = kernel.function
    if not isinstance(signature, dict) or not isinstance(function, int) or not function:
        return None
    td_meta = getattr(kernel.metadata, "tensordesc_meta", None) or None
    params: list[tuple] = []
    descs = 0
    for slot, ty in zip(ln.slots, signature.values(), strict=True):
        if not isinstance(ty, str):
            return None  # a tuple argument
        if ty == "constexpr":
            continue
        kind = slot[0]
        if ty.startswith("tensordesc"):
            meta = td_meta[descs] if td_meta else None
            descs += 1
            if kind != "desc":
                return None
            _, arg, shape, strides, padding = slot
            if meta is None:
                params += [(0, arg), *[(1, 8, x) for x in (*shape, *strides)],
                           (1, 1, int(padding == "nan"))]
            else:
                if meta.get("fp4_padded"):
                    return None
                from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

                params.append((2, arg, TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                               meta["swizzle"], int(padding == "nan"), meta["elem_size"],
                               list(meta["block_size"]), list(shape), list(strides)))
            params += [(1, 4, x) for x in shape] + [(1, 8, x) for x in strides]
        elif ty.startswith("*"):
            if kind == "arg":
                params.append((0, slot[1]))
            elif kind == "const" and isinstance(slot[1], torch.Tensor):
                params.append((1, 8, slot[1].data_ptr()))
            else:
                return None
        else:
            packed = _scalar(ty, slot[1]) if kind == "const" else None
            if packed is None:
                return None
            params.append(packed)
    params.append((3, launcher.global_scratch_size) if launcher.global_scratch_size
                  else (1, 8, 0))
    params.append((1, 8, 0))  # profile scratch: none (refused above)
    return (function, *ln.grid, 32 * kernel.metadata.num_warps, kernel.metadata.shared,
            bool(launcher.launch_pdl), bool(launcher.launch_cooperative_grid), params)


def _program(record: "_Record") -> list | None:
    """A record's launches in the C++ record's form, or None (computed once per record)."""
    if record.program is _MISSING:
        try:
            launches = [_program_launch(ln) for ln in record.launches]
        except Exception:  # another triton's objects: the Python replay serves it
            launches = [None]
        record.program = None if any(x is None for x in launches) else launches
    return record.program


class _Record:
    __slots__ = ("launches", "device", "tables", "program")

    def __init__(self, calls, values: tuple, device: torch.device, tables: tuple):
        self.tables = tables  # the launch tables it was selected from (by identity)
        names = {}
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                names.setdefault(id(v), i)
        self.launches = [_Launch(fn, k, g, a, kw, names) for fn, k, g, a, kw in calls]
        self.device = device
        self.program = _MISSING

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
    """The record a call with these arguments would replay, or None (tests): as the public
    function keys it, or as the op's kernel does (the dispatcher passes the arguments
    positionally, without the trailing ones that equal their defaults)."""
    from . import platform

    plat = platform.current()
    record = _RECORDS.get(_key(op, _values(op, args, kwargs), plat))
    if record is None and "config" not in kwargs:
        schema = getattr(torch.ops.mla, op).default._schema.arguments
        full = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
                for i, a in enumerate(schema)]
        while full:
            a, v = schema[len(full) - 1], full[-1]
            if not a.has_default_value() or isinstance(v, torch.Tensor) or v != a.default_value:
                break
            full.pop()
        record = _RECORDS.get(_key(op, _values(op, tuple(full), {}), plat))
    return record


def recorded(op: str, tables: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorate the public launcher of ``mla::<op>`` (positional arguments in the op's order,
    keyword-only knobs after), whose configs come from the launch ``tables`` of these kernels:
    replay a recorded call of the same geometry, else run and record it (module docstring).

    The decorated function calls the op where the C++ library replays (a ``config=`` aside);
    its ``op_kernel`` is what the op's CUDA kernel runs: the Python replay or the full path,
    committing the record to the C++ library when that call came through it."""
    from . import platform, tuning

    def wrap(launcher: Callable) -> Callable:
        types = None  # (per position, by name): _routed_types, on the first call

        def python_path(args, kwargs, commit: bool):
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
                    if commit:
                        _commit(op, record)
                    return None
                record = _MISSING  # a table was reloaded since: select again
            with _recording() as calls:
                out = launcher(*args, **kwargs)
            if record is _MISSING:
                if len(_RECORDS) >= _MAX_RECORDS:
                    _RECORDS.clear()
                try:
                    record = _RECORDS[key] = _Record(calls, values, device, in_force)
                except _Unrecordable:
                    record = _RECORDS[key] = None  # this geometry always takes the full path
                if commit and record is not None:
                    _commit(op, record)
            return out

        # The op's kernel gets every schema argument positionally; those the function takes
        # keyword-only (decode_verify's qo_indptr / tree_mask) go to it by name.
        positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                         for p in inspect.signature(launcher).parameters.values())

        def op_kernel(*args):
            if len(args) > positional:
                from .host import _op_args

                extra = dict(zip(_op_args(op)[positional:], args[positional:]))
                return python_path(args[:positional], extra, True)
            return python_path(args, {}, True)

        @functools.wraps(launcher)
        def call(*args, **kwargs):
            nonlocal types
            if _cpp_route[0]:
                if types is None:
                    types = _routed_types(op)
                    types = (tuple(types.values()), types)
                first = args[0] if args else kwargs.get(next(iter(types[1])))
                # Only arguments the op's schema takes as they are (_ROUTED): anything else
                # (a float for an int, a tensor subclass) takes the Python path, which names it.
                if type(first) is _Tensor and (first.is_cuda or _cpp_route[1]) and len(
                        args) <= len(types[0]) and all(
                        type(v) in t for v, t in zip(args, types[0])) and (not kwargs or all(
                        type(v) in types[1].get(k, ()) for k, v in kwargs.items())):
                    return getattr(torch.ops.mla, op).default(*args, **kwargs)
            return python_path(args, kwargs, False)

        call.full_path = launcher  # the unrecorded launcher (tests, A/B)
        call.op_kernel = op_kernel  # the op's CUDA kernel (mla_ops.library)
        return call

    return wrap


def _commit(op: str, record: "_Record") -> None:
    cpp = _cpp()
    program = _program(record) if cpp is not None else None
    if program is not None:
        cpp.commit(f"mla::{op}", program)


# [public functions call the op on CUDA tensors (the C++ replays), and on CPU tensors too (the
# tests' dry run)]; set by _init_cpp_route.
_cpp_route: list = [False, False]


def _init_cpp_route() -> None:
    _cpp_route[0] = _cpp() is not None and _static_reason() is None
    sync()


_init_cpp_route()
