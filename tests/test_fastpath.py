"""mla_ops.fastpath: a replayed call launches exactly what the full path (checks, tables,
Triton's JIT dispatch) launches for the same call — the same compiled kernel, grid and
arguments — over random shapes, strides, alignments, dtypes, page sizes, split counts and
argument aliasing; and dropping any field of the replay's key (one mutant per field) makes
that fail.

On a CPU machine Triton cannot compile for a GPU, so the dispatch is Triton's own binder (its
``specialize_impl`` of every argument, for an sm_90 target) in front of a kernel cache keyed as
Triton keys it: a fake compiled kernel per key, whose launches are logged. On a GPU the real
dispatch compiles and launches (the GPU test at the end).
"""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

import mla_ops
from mla_ops import fastpath
from mla_ops.merge.launch import merge_attn_states
from mla_ops.platform import mock_platform

from builders import SM_SCALE, decode_case

_LOG: list = []


class _FakeLauncher:
    """A ``CompiledKernel.run``: logs the launches; the attributes a record reads."""

    global_scratch_size = profile_scratch_size = 0
    launch_pdl = launch_cooperative_grid = False
    num_ctas = 1

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
        k = self.kernel
        assert function is k.function and packed is k.packed_metadata
        _LOG.append((k, (g0, g1, g2), args))


class _FakeKernel:
    """Stands in for a ``CompiledKernel``: one per Triton cache key (its signature, warps and
    a function handle of its own); logs its launches."""

    def __init__(self, key, signature: dict, num_warps: int):
        self.key, self.packed_metadata = key, object()
        self.function = 0x1000 + len(_FAKE_KERNELS) * 16  # a handle: an int, as Triton's
        _FAKE_KERNELS.append(self)
        self.src = type("Src", (), {"signature": signature})()
        self.metadata = type("Meta", (), {"num_warps": num_warps, "shared": 1024 + num_warps,
                                          "tensordesc_meta": None})()
        self.run = _FakeLauncher(self)


_FAKE_KERNELS: list = []


@contextlib.contextmanager
def fake_dispatch():
    """Triton's dispatch for an sm_90 target without a GPU (module docstring); replays of CPU
    tensors allowed, with a null stream. Needs a process without TRITON_INTERPRET (where the
    kernels are JIT functions, not the interpreter's)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders, kernels = {}, {}

    def run(self, *args, grid, warmup, **kwargs):
        binder = binders.get(id(self))
        if binder is None:
            binder = binders[id(self)] = create_function_from_signature(self.signature,
                                                                        self.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        key = (id(self), tuple(specialization), str(sorted(options.items())))
        kernel = kernels.get(key)
        if kernel is None:
            signature = {p.name: spec[0] for p, spec in zip(self.params, specialization)}
            kernel = kernels[key] = _FakeKernel(key, signature, options.get("num_warps", 4))
        grid = tuple(grid) + (1,) * (3 - len(grid))
        kernel.run(*grid, 0, kernel.function, kernel.packed_metadata, None, None, None,
                   *bound.values())
        return kernel

    mp = pytest.MonkeyPatch()
    mp.setattr(JITFunction, "run", run)
    mp.setattr(fastpath, "_REPLAY_DEVICES", ("cuda", "cpu"))
    mp.setattr(fastpath, "_device_and_stream", lambda d: (contextlib.nullcontext(), 0))
    mp.setattr(fastpath, "status", lambda: None)
    fastpath.clear()
    try:
        with mock_platform("sm_90", interpret=False):
            yield mp
    finally:
        mp.undo()
        fastpath.clear()


def _same_launches(fast, full) -> None:
    assert len(fast) == len(full), (len(fast), len(full))
    for (k1, g1, a1), (k2, g2, a2) in zip(fast, full):
        assert k1 is k2, f"another compiled kernel: {k1.key[1:]} vs {k2.key[1:]}"
        assert g1 == g2, (g1, g2)
        assert len(a1) == len(a2)
        for x, y in zip(a1, a2):
            if isinstance(y, torch.Tensor):
                assert x is y
            elif hasattr(y, "block_shape"):  # a TMA descriptor: same base, shape, strides
                assert x.base is y.base and list(x.shape) == list(y.shape)
                assert list(x.strides) == list(y.strides)
            else:
                assert type(x) is type(y) and x == y, (x, y)


def _decode_call(rng: random.Random, twin: str | None = None):
    """Random decode-verify arguments, as a recipe for fresh calls of one geometry; ``twin``
    changes one field of the same draw (what the key must tell apart): ``dtype``, ``strides``
    (q a view of a wider tensor), ``alignment`` (q one element off 16 bytes), ``shape`` (one
    more request), ``values`` (another softmax scale), ``aliasing`` (seq_lens passed as
    real_seq_lens)."""
    qlen, heads = rng.choice([1, 2, 3]), rng.choice([4, 16])
    batch = rng.choice([1, 2, 3]) + (twin == "shape")
    page = rng.choice([1, 16, 32])
    dtype = rng.choice([torch.float16, torch.float32])
    if twin == "dtype":
        dtype = torch.float32 if dtype == torch.float16 else torch.float16
    lens = [rng.randint(qlen, 80) for _ in range(batch)]
    q_strided = (rng.random() < 0.3) != (twin == "strides")
    kw = dict(batch=batch, heads=heads, qlen=qlen, lens=lens, page=page, dtype=dtype,
              layout=rng.choice(["4d", "3d", "cross"]), q_strided=q_strided,
              real=[max(0, n - 1) for n in lens] if rng.random() < 0.5 or twin == "aliasing" else None)
    splits = rng.choice([1, 2, 3])
    misalign = (rng.random() < 0.3) != (twin == "alignment")
    alias_real = (rng.random() < 0.5) != (twin == "aliasing") if kw["real"] is not None else False
    scale = rng.choice([SM_SCALE, 0.125]) if twin != "values" else 0.25

    def make():
        case = decode_case("cpu", **kw, sm_scale=scale)
        args = case.op_args(splits)
        if misalign:
            q = args["q"]
            wide = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
            wide.copy_(q)
            args["q"] = wide
        if alias_real:
            args["real_seq_lens"] = args["seq_lens"]
        return tuple(args.values())

    return make


TWINS = ("dtype", "strides", "alignment", "shape", "values", "aliasing")


def _merge_call(rng: random.Random, twin: str | None = None):
    P, rows, heads, dim = rng.choice([1, 2, 3]), rng.choice([1, 4]), rng.choice([1, 2]), rng.choice([16, 40])
    dtype = rng.choice([torch.float16, torch.float32])
    with_lse = rng.random() < 0.5

    def make():
        o_parts = torch.randn(P, rows, heads, dim).to(dtype)
        lse_parts = torch.randn(P, rows, heads)
        o = torch.full((rows, heads, dim), float("nan"), dtype=dtype)
        return (o_parts, lse_parts, o, torch.empty(rows, heads) if with_lse else None)

    return make


def _encoder_call(rng: random.Random, twin: str | None = None):
    """Random encoder arguments (head dims split into a power of 2 and a tail, causal or not,
    fp16/bf16); ``twin`` changes the head dim."""
    from builders import encoder_case

    d = rng.choice([64, 72, 80, 128]) + 8 * (twin is not None)
    lens = [rng.randint(1, 300) for _ in range(rng.choice([1, 2, 3]))]
    causal, dtype = rng.random() < 0.5, rng.choice([torch.float16, torch.bfloat16])

    def make():
        case = encoder_case("cpu", lens=lens, hq=4, hkv=4, d=d, dtype=dtype, causal=causal)
        return tuple(case.op_args().values())

    return make


CALLS = {"decode_verify": (mla_ops.decode_attention_fwd_verify, _decode_call),
         "merge_attn_states": (merge_attn_states, _merge_call)}
# The C++ dry run also replays the encoder (the Python replay check above predates it).
CPP_CALLS = {**CALLS, "context_attention": (mla_ops.context_attention_fwd, _encoder_call)}


def _compare(recorded, args) -> None:
    """One call recorded or replayed, then the full path on the same arguments: the same
    launches."""
    _LOG.clear()
    recorded(*args)
    fast = list(_LOG)
    _LOG.clear()
    recorded.full_path(*args)
    _same_launches(fast, list(_LOG))


def _check_replays(op: str, n: int, seed: int) -> int:
    """``n`` random geometries, each called three times with fresh tensors (the first records,
    the others replay), each call's launches compared with the full path's for the same
    arguments. Returns the number of replays compared."""
    public, recipe = CALLS[op]
    recorded = public.__wrapped__  # below the CPU routing: the replaying launcher
    makes = []
    for i in range(n):  # each draw, and its twins differing in one field each
        for twin in (None, *TWINS):
            makes.append(recipe(random.Random(seed * 1000 + i), twin))
    rng = random.Random(seed)
    replays = 0
    for rnd in range(3):
        for make in makes if rnd == 0 else rng.sample(makes, len(makes)):
            before = len(fastpath._RECORDS)
            _compare(recorded, make())
            replays += len(fastpath._RECORDS) == before
    return replays


# Each mutant drops one field of the replay key; the same check must then fail. The mutant
# keys are the real one's logic with a field left out (``_key_without(None)`` is checked to
# equal the real key).
_REAL_KEY = fastpath._key
_TENSOR_FIELDS = ("dtype", "shape", "strides", "device", "alignment", "aliasing")


def _key_without(drop):
    def key(op, values, plat):
        facts = [op, fastpath._generation[0], plat if drop != "platform" else None]
        first = {}
        for i, v in enumerate(values):
            if type(v) is torch.Tensor:
                f = dict(zip(_TENSOR_FIELDS, (
                    v.dtype, v.shape, v.stride(), v.device, v.data_ptr() & 63,
                    first.setdefault(id(v), i))))
                f.pop(drop, None)
                facts += tuple(f.values())
            elif type(v) in (int, float, bool, type(None)):
                facts += (type(v), None if drop == "values" else v)
            else:
                facts.append(fastpath._fact(v))
        return tuple(facts)
    return key


KEY_MUTANTS = {name: ("_key", _key_without(name))
               for name in ("dtype", "shape", "strides", "alignment", "values", "aliasing", "platform")}
KEY_MUTANTS["table identity"] = ("_same_tables", lambda recorded_from, in_force: True)


def _platform_check() -> None:
    """The platform in force is in the key: another arch, or the same arch with another SM
    count (the persistent grid of the portable kernel at M3's shape), selects again."""
    recorded = mla_ops.decode_attention_fwd_verify.__wrapped__
    make = _decode_call(random.Random(3))
    m3 = decode_case("cpu", batch=128, heads=16, qlen=4, lens=[8] * 128, page=64,
                     dtype=torch.float16)
    for arch, sms in (("sm_90", 132), ("sm_80", 108), ("gfx942", 304), ("sm_90", 132),
                      ("sm_90", 8), ("sm_90", 132)):
        with mock_platform(arch, sm_count=sms, interpret=False):
            _compare(recorded, make())
            _compare(recorded, tuple(m3.op_args(1).values()))


def _table_check() -> None:
    """A replay checks the tables it was selected from: a table reloaded under the same
    platform (another BLOCK_N) selects again."""
    from mla_ops import tuning

    recorded = mla_ops.decode_attention_fwd_verify.__wrapped__
    make = _decode_call(random.Random(4))
    kernel = tuning.KERNELS["decode_verify"]
    try:
        with mock_platform("fastpath-test", sm_count=132, is_hip=False, interpret=False):
            for block_n in (16, 32, 16):
                kernel.builtin["fastpath-test"] = {"arch": "fastpath-test", "rules": [
                    {"config": {"BLOCK_N": block_n, "BLOCK_H": 16}}]}
                tuning.table.cache_clear()
                _compare(recorded, make())
    finally:
        kernel.builtin.pop("fastpath-test", None)
        tuning.table.cache_clear()


def _main() -> None:  # in a subprocess without TRITON_INTERPRET (see results)
    import json
    import sys

    out = {}
    with fake_dispatch():
        for seed in range(3):  # the mutants' logic is the real key's
            args = _decode_call(random.Random(seed))()
            values = fastpath._values("decode_verify", args, {})
            plat = mla_ops.platform.current()
            assert _key_without(None)("decode_verify", values, plat) == _REAL_KEY(
                "decode_verify", values, plat)
        for op in sorted(CALLS):
            out[op] = _check_replays(op, 12, seed=1)
        _platform_check()
        _table_check()
        out["tables"] = "same launches"
    for mutant, (name, replacement) in sorted(KEY_MUTANTS.items()):
        with fake_dispatch() as mp:
            mp.setattr(fastpath, name, replacement)
            try:
                if mutant == "platform":
                    _platform_check()
                elif mutant == "table identity":
                    _table_check()
                else:
                    _check_replays("decode_verify", 12, seed=1)
                out[mutant] = "survived"
            except AssertionError as e:
                out[mutant] = f"killed: {(str(e).splitlines() or [repr(e)])[0][:120]}"
    sys.stdout.write("[" + json.dumps(out) + "]\n")


# --- the C++ replays (mla_ops._C), dry: what they would launch ------------------------------------


def _launcher_params(kernel, args) -> list[bytes]:
    """The parameters Triton 3.6's launcher passes to ``cuLaunchKernelEx`` for a logged launch
    of the full path (written from its ``make_launcher``, independently of mla_ops.fastpath):
    each non-constexpr argument (a host descriptor without TMA lowering as base, shape and
    strides as i64, its padding, shape as i32, strides as i64), then two null scratch
    addresses."""
    import struct

    formats = {"i1": "<b", "i8": "<b", "u8": "<B", "i16": "<h", "i32": "<i", "u32": "<I",
               "i64": "<q", "u64": "<Q", "fp32": "<f", "fp64": "<d"}
    out = []
    for ty, v in zip(kernel.src.signature.values(), args, strict=True):
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            shape, strides = list(v.shape), list(v.strides)
            out.append(struct.pack("<Q", v.base.data_ptr()))
            out += [struct.pack("<q", x) for x in shape + strides]
            out.append(struct.pack("<b", v.padding == "nan"))
            out += [struct.pack("<i", x) for x in shape] + [struct.pack("<q", x) for x in strides]
        elif ty.startswith("*"):
            out.append(struct.pack("<Q", v.data_ptr()))
        else:
            out.append(struct.pack(formats[ty], v))
    return out + [bytes(8), bytes(8)]


def _cpp_compare(recorded, args) -> bool:
    """One call through the op (the C++ replay, or on a miss the Python kernel that records),
    then the full path: a dry C++ replay logged the launches, grids, warps and parameter bytes
    the full path's launcher would pass. True when the C++ side replayed."""
    cpp = fastpath._cpp()
    cpp.take_log()
    _LOG.clear()
    recorded(*args)
    got, python = cpp.take_log(), list(_LOG)
    _LOG.clear()
    recorded.full_path(*args)
    full = list(_LOG)
    if not got:
        _same_launches(python, full)
        return False
    assert not python, "a call replayed in C++ also ran the Python path"
    assert len(got) == len(full), (len(got), len(full))
    for (function, grid, block, shared, pdl, coop, params), (k, g, a) in zip(got, full):
        assert function == k.function, f"another compiled kernel: {k.key[1:]}"
        assert grid == g and block == 32 * k.metadata.num_warps, (grid, g, block)
        assert shared == k.metadata.shared and not pdl and not coop
        want = _launcher_params(k, a)
        assert len(params) == len(want), (len(params), len(want))
        for i, (x, y) in enumerate(zip(params, want)):
            assert x == y, f"parameter {i}: {x.hex()} != {y.hex()}"
    return True


def _cpp_check(op: str, n: int, seed: int) -> int:
    """As _check_replays, through the op and the C++ replays."""
    public, recipe = CPP_CALLS[op]
    recorded = public.__wrapped__  # calls the op
    makes = [recipe(random.Random(seed * 1000 + i), twin) for i in range(n)
             for twin in (None, *TWINS)]
    rng = random.Random(seed)
    replays = 0
    for rnd in range(3):
        for make in makes if rnd == 0 else rng.sample(makes, len(makes)):
            replays += _cpp_compare(recorded, make())
    return replays


@contextlib.contextmanager
def cpp_dry_run():
    """The fake dispatch, with the public functions calling the ops, whose CPU kernel is the
    CUDA one (records and commits), and the C++ replays dry on CPU tensors."""
    import inspect

    with fake_dispatch() as mp:
        mp.setattr(fastpath, "_cpp_route", [True, True])
        mp.setattr(fastpath, "_cpp_allowed", lambda: True)
        mp.setattr(fastpath, "_cpp_test_mode", (True, True))
        lib = torch.library.Library("mla", "IMPL")
        override = ({"allow_override": True} if "allow_override" in
                    inspect.signature(torch.library.Library.impl).parameters else {})
        for op, (public, _) in CPP_CALLS.items():
            lib.impl(op, public.op_kernel, "CPU", **override)
        fastpath.sync()
        try:
            yield
        finally:
            lib._destroy()
            mp.setattr(fastpath, "_cpp_test_mode", ())
            fastpath.sync()


CPP_MUTANTS = ("dtype", "shape", "strides", "alignment", "values", "aliasing")


def _cpp_main() -> None:  # in a subprocess without TRITON_INTERPRET
    import json
    import sys

    cpp = fastpath._cpp()
    out = {}
    with cpp_dry_run():
        for op in sorted(CPP_CALLS):
            out[op] = _cpp_check(op, 8, seed=2)
        out["stats"] = cpp.stats()
        for field in CPP_MUTANTS:
            cpp.drop_key_field(field)
            try:
                _cpp_check("decode_verify", 8, seed=2)
                out[field] = "survived"
            except AssertionError as e:
                out[field] = f"killed: {(str(e).splitlines() or [repr(e)])[0][:120]}"
            finally:
                cpp.drop_key_field("")
    sys.stdout.write("[" + json.dumps(out) + "]\n")


@pytest.fixture(scope="module")
def cpp_results():
    if torch.cuda.is_available():
        pytest.skip("the dry run stands in for a GPU")
    if fastpath._cpp() is None:
        pytest.skip("mla_ops._C is not loaded: no C++ replays here")
    from gluon_offline import run_in_subprocess

    return run_in_subprocess("tests.test_fastpath", "_cpp_main", 600)[0][0]


@pytest.mark.parametrize("op", sorted(CPP_CALLS))
def test_a_cpp_replay_passes_what_tritons_launcher_passes(op, cpp_results):
    # (a mismatch raises in _cpp_main); the first round records, the two others replay (a
    # geometry that makes a scratch tensor never does)
    assert cpp_results[op] >= 8 * (1 + len(TWINS)), cpp_results


@pytest.mark.parametrize("field", CPP_MUTANTS)
def test_every_cpp_key_field_is_needed(field, cpp_results):
    assert cpp_results[field].startswith("killed"), f"dropping {field} from the C++ key survived"


@pytest.fixture(scope="module")
def results():
    if torch.cuda.is_available():
        pytest.skip("the fake dispatch stands in for a GPU")
    from gluon_offline import run_in_subprocess

    return run_in_subprocess("tests.test_fastpath", "_main", 600)[0][0]


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_replay_launches_what_the_full_path_launches(op, results):
    assert results[op] >= 12 * (1 + len(TWINS)), "replays were not exercised"  # (a mismatch raises in _main)


def test_a_reloaded_table_or_another_platform_selects_again(results):
    assert results["tables"] == "same launches"


@pytest.mark.parametrize("mutant", sorted(KEY_MUTANTS))
def test_every_key_field_is_needed(mutant, results):
    assert results[mutant].startswith("killed"), f"dropping {mutant} from the key survived"


def test_replays_are_off_where_unchecked(monkeypatch):
    monkeypatch.setenv(fastpath.ENV_OFF, "1")
    assert fastpath.status() == f"{fastpath.ENV_OFF} is set"
    monkeypatch.delenv(fastpath.ENV_OFF)
    fastpath._static_reason.cache_clear()
    monkeypatch.setattr(fastpath.triton, "__version__", "3.9.0")
    try:
        assert "3.9.0" in fastpath.status()
    finally:
        fastpath._static_reason.cache_clear()


# --- on the GPU: the real dispatch ------------------------------------------------------------------


def _gpu_check(op: str, public, args: tuple, outputs: tuple, config=None) -> None:
    """Record, replay, then the full path on the same arguments: the replay launched the
    compiled kernels Triton's dispatch returns for this call, and wrote the same bits."""
    kw = {"config": config} if config else {}
    recorded = public.__wrapped__
    recorded(*args, **kw)
    for t in outputs:
        t.fill_(float("nan"))
    before = fastpath.cpp_stats()
    recorded(*args, **kw)  # a replay: in C++ where the call goes through the op
    if fastpath._cpp_route[0] and not kw:
        assert fastpath.cpp_stats()["hits"] == before["hits"] + 1, "not replayed in C++"
    got = [t.clone() for t in outputs]
    record = fastpath.record_of(op, *args, **kw)
    assert record is not None, "the call was not recorded"
    for t in outputs:
        t.fill_(float("nan"))
    with fastpath._recording() as calls:
        recorded.full_path(*args, **kw)
    assert [ln.kernel for ln in record.launches] == [k for _, k, *_ in calls]
    for a, b in zip(got, outputs):
        assert torch.equal(a, b), "a replay wrote other bits than the full path"


@pytest.mark.gpu
@pytest.mark.skipif(fastpath.status() is not None and torch.cuda.is_available(),
                    reason=f"replays are off here: {fastpath.status()}")
@pytest.mark.parametrize("family", [None, "triton", "gluon"], ids=["table", "triton", "gluon"])
def test_gpu_a_replay_runs_tritons_kernel_bitwise(family):
    """Random geometries on the H200 (both families, page sizes 1-64, bf16 and fp8 caches,
    misaligned and strided q, one split and several)."""
    from mla_ops.decode_verify.gluon_launch import gluon_unsupported_shape

    rng = random.Random(7)
    for i in range(24):
        kw = dict(batch=rng.choice([1, 3, 8]), heads=rng.choice([16, 128]), qlen=rng.choice([1, 2, 4]),
                  page=rng.choice([1, 16, 64]), Lv=512, rope=64, dtype=torch.bfloat16,
                  cache_dtype=rng.choice([None, None, torch.float8_e4m3fn]),
                  q_strided=rng.random() < 0.3, layout=rng.choice(["4d", "3d", "cross"]))
        kw["lens"] = [rng.randint(kw["qlen"], 3000) for _ in range(kw["batch"])]
        if family == "gluon" and gluon_unsupported_shape(
                torch.device("cuda"), torch.bfloat16, kw["cache_dtype"] or torch.bfloat16,
                kw["heads"], 576, 512, kw["page"]) is not None:
            kw["page"] = 64
        case = decode_case("cuda", **kw)
        splits = rng.choice([1, 2, 5])
        args = case.op_args(splits)
        _gpu_check("decode_verify", mla_ops.decode_attention_fwd_verify, tuple(args.values()),
                   (args["o"], args["lse"]), config={"family": family} if family else None)


@pytest.mark.gpu
@pytest.mark.skipif(fastpath.status() is not None and torch.cuda.is_available(),
                    reason=f"replays are off here: {fastpath.status()}")
def test_gpu_encoder_and_merge_replays_bitwise():
    from builders import encoder_case

    for d, causal in ((72, False), (80, True), (64, False), (128, False)):
        case = encoder_case("cuda", lens=[700, 33, 1200], hq=16, hkv=16, d=d, dtype=torch.bfloat16)
        args = case.op_args(is_causal=causal)
        _gpu_check("context_attention", mla_ops.context_attention_fwd, tuple(args.values()),
                   (args["o"],))
    o_parts = torch.randn(3, 64, 16, 512, device="cuda", dtype=torch.bfloat16)
    lse_parts = torch.randn(3, 64, 16, device="cuda")
    o, lse = torch.empty(64, 16, 512, device="cuda", dtype=torch.bfloat16), torch.empty(64, 16, device="cuda")
    _gpu_check("merge_attn_states", merge_attn_states, (o_parts, lse_parts, o, lse), (o, lse))


@pytest.mark.gpu
@pytest.mark.skipif(fastpath.status() is not None and torch.cuda.is_available(),
                    reason=f"replays are off here: {fastpath.status()}")
def test_gpu_replays_captured_in_a_graph():
    """Recorded eagerly, replayed inside a capture: the graph holds the replayed launches and a
    replay of the graph reads new contents."""
    case = decode_case("cuda", batch=8, heads=16, qlen=2, lens=[2000] * 8, page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16)
    args = case.op_args(4)
    mla_ops.decode_attention_fwd_verify(**args)  # records
    before, hits = len(fastpath._RECORDS), (fastpath.cpp_stats() or {}).get("hits")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mla_ops.decode_attention_fwd_verify(**args)
    assert len(fastpath._RECORDS) == before
    if fastpath._cpp_route[0]:  # the capture holds the C++ replay's launches
        assert fastpath.cpp_stats()["hits"] == hits + 1
    assert args["q"] is case.q  # new contents, read by the reference too
    case.q.copy_(torch.randn_like(case.q) * case.q.float().std())
    args["o"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    case.assert_matches(args["o"], args["lse"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not fastpath._cpp_route[0],
                    reason="no C++ replays here (needs a GPU, mla_ops._C and triton 3.6)")
def test_gpu_compiled_calls_replay_in_cpp():
    """torch.compile(fullgraph=True) of a step that calls the op: the compiled code calls it
    through the dispatcher, so its second run replays in C++, with the eager call's bits."""
    case = decode_case("cuda", batch=3, heads=16, qlen=2, lens=[700, 2000, 64], page=64,
                       Lv=512, rope=64, dtype=torch.bfloat16)
    args = case.op_args(3)

    @torch.compile(fullgraph=True)
    def step(q):
        torch.ops.mla.decode_verify(q, *list(args.values())[1:])

    step(args["q"])
    hits = fastpath.cpp_stats()["hits"]
    args["o"].fill_(float("nan"))
    step(args["q"])
    assert fastpath.cpp_stats()["hits"] == hits + 1
    got = args["o"].clone()
    args["o"].fill_(float("nan"))
    mla_ops.decode_attention_fwd_verify.full_path(*args.values())
    assert torch.equal(got, args["o"])
    case.assert_matches(args["o"], args["lse"])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_replays_on_the_second_gpu():
    case = decode_case("cuda:1", batch=2, heads=16, qlen=2, lens=[900, 40], page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16)
    args = case.op_args(2)
    _gpu_check("decode_verify", mla_ops.decode_attention_fwd_verify, tuple(args.values()),
               (args["o"], args["lse"]))
    assert torch.cuda.current_device() == 0


def test_a_tensor_subclass_is_never_keyed():
    """A tensor subclass (a fake tensor under tracing, a wrapper with its own dispatch) takes
    the full path: the key gives None for it rather than reading its address."""
    class Wrapped(torch.Tensor):
        pass

    plain = torch.zeros(4)
    plat = mla_ops.platform.current()
    assert fastpath._key("merge_attn_states", (plain, None), plat) is not None
    assert fastpath._key("merge_attn_states", (plain.as_subclass(Wrapped), None), plat) is None
