"""csrc_meta/ (built as ``mla_ops._C``) against the Python registration of ``torch.ops.mla``.

Both sides define the same ops: the C++ library (schemas, Meta kernels, Autograd and
ADInplaceOrView kernels) when it is built, ``torch.library.custom_op`` when it is not or when
``MLA_OPS_NO_EXT=1``. Checked here:

- the schemas of both sides, pinned and equal;
- a process that loads only the compiled library (no ``import mla_ops``) runs each op on meta
  tensors, gets a clear error for a bad shape, and runs an exported program on meta tensors;
- the C++ Meta kernels (generated from ``mla_ops/spec.py`` at build time) raise what the
  Python checks compiled from the same spec raise (``library.CHECKS``: type and message), bad
  input by bad input, and trace dynamic shapes without recompiling;
- this process (C++ side when built) and a ``MLA_OPS_NO_EXT=1`` subprocess (pure Python) agree
  on everything observable: schemas, tags, opcheck, torch.compile, fake-mode errors, the
  inference-only error, version bumps, and running the same saved torch.export program;
- setup.py builds the library from the spec and says so, falls back to a pure-Python build
  when the compiler fails, and records which in ``_C.status``; ``library.EXTENSION_STATUS``
  reports it in one line.

Tests that need the built library skip when it is absent; the pure-Python ones always run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import expecttest
import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import _ext, library, spec

from builders import decode_case, encoder_case, interpret, to_meta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SO = _ext.library_path()  # the built library, whether or not this process loaded it
LOADED = library.EXTENSION is not None  # the C++ side defined the ops in this process

needs_so = pytest.mark.skipif(SO is None, reason="mla_ops._C is not built (pure-Python install)")
needs_loaded = pytest.mark.skipif(
    not LOADED, reason="mla_ops._C is not loaded here (not built, or MLA_OPS_NO_EXT=1)"
)

OPS = tuple(library.SCHEMAS)
CHECKS = library.CHECKS  # the Python side: compiled from mla_ops/spec.py


def _run(code_or_args, env=None, timeout=120, cwd=ROOT) -> dict:
    """Run Python in a fresh process; it prints one JSON object last."""
    cmd = [sys.executable, *code_or_args] if isinstance(code_or_args, list) else [
        sys.executable, "-c", code_or_args]
    env = env or {}
    full_env = {**os.environ, "TRITON_INTERPRET": "0", **env}
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [env.get("PYTHONPATH"), ROOT, os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=cwd)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- valid arguments, as keyword dicts (the schema's names), from tests/builders.py ----------


def decode_verify_args(device="cpu", *, B=2, Lv=32, rope=32, splits=1):
    """B requests of 2 verify tokens, 4 heads, Lk = Lv + rope, pages of 16, lengths below 32."""
    lens = (20, 31) if B == 2 else tuple((7 * i + 3) % 31 + 1 for i in range(B))
    case = decode_case("cpu", batch=B, heads=4, qlen=2, lens=lens, page=16, Lv=Lv, rope=rope)
    return case.meta_args(splits) if device == "meta" else case.op_args(splits)


def warmup_args(device="cpu", *, Lv=32, rope=32):
    case = decode_case("cpu", batch=2, heads=4, qlen=2, lens=(20, 31), page=16, Lv=Lv, rope=rope)
    args = case.warmup_args(qlens=(1, 2), num_kv_splits=2)
    return to_meta(args) if device == "meta" else args


def context_args(device="cpu", *, H=4, Hkv=2, D=32):
    case = encoder_case("cpu", lens=(5, 9), hq=H, hkv=Hkv, d=D, dtype=torch.float32)
    return case.meta_args() if device == "meta" else case.op_args()


def merge_args(device="cpu", *, P=2, rows=3, H=4, D=32):
    """P partial states of ``rows`` x H heads x D, some rows seen by no partial (-inf)."""
    make = (lambda *s: torch.empty(s, device="meta")) if device == "meta" else torch.randn
    lse_parts = make(P, rows, H)
    if device != "meta":
        lse_parts[:, 0, 0] = float("-inf")
    return dict(o_parts=make(P, rows, H, D), lse_parts=lse_parts, o=make(rows, H, D),
                lse=make(rows, H))


def rescale_args(device="cpu", *, P=2, rows=3, H=4, D=32):
    a = merge_args(device, P=P, rows=rows, H=H, D=D)
    return dict(o_part=a["o_parts"][1], lse_parts=a["lse_parts"], part=1, o_out=a["o"],
                lse_out=a["lse"])


VALID = {"decode_verify": decode_verify_args, "warmup_decode_verify": warmup_args,
         "context_attention": context_args, "merge_attn_states": merge_args,
         "rescale_attn_partial": rescale_args}


# --- bad input: each case edits valid meta arguments -----------------------------------------


def _m(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


FP8 = torch.float8_e4m3fn
BAD = [
    # decode_verify: one case per rule, in the order spec.py declares them
    ("dv-q-rank", "decode_verify", lambda a: {"q": a["q"][0]}),
    ("dv-q-dtype", "decode_verify", lambda a: {"q": a["q"].int()}),
    ("dv-cache-rank", "decode_verify", lambda a: {"k_buffer": a["k_buffer"][0, 0]}),
    ("dv-cache-dtype", "decode_verify", lambda a: {"k_buffer": a["k_buffer"].double()}),
    ("dv-cache-two-heads", "decode_verify",
     lambda a: {"k_buffer": a["k_buffer"].expand(-1, -1, 2, -1)}),
    ("dv-page-size-zero", "decode_verify", lambda a: {"page_size": 0}),
    ("dv-page-size-4d", "decode_verify", lambda a: {"page_size": 64}),
    ("dv-page-size-3d", "decode_verify",
     lambda a: {"k_buffer": _m(100, 1, 64), "v_buffer": _m(100, 1, 64)[..., :32]}),
    ("dv-cache-token-stride-0", "decode_verify",
     lambda a: {"k_buffer": _m(1, 1, 64).expand(32, 1, 64),
                "v_buffer": _m(1, 1, 64).expand(32, 1, 64)[..., :32]}),
    ("dv-cache-inner-stride", "decode_verify",
     lambda a: {"k_buffer": _m(8, 16, 1, 128)[..., ::2], "v_buffer": _m(8, 16, 1, 32)}),
    ("dv-cache-vs-q-dtype", "decode_verify", lambda a: {"k_buffer": a["k_buffer"].half(),
                                                        "v_buffer": a["v_buffer"].half()}),
    ("dv-v-rank", "decode_verify", lambda a: {"v_buffer": a["v_buffer"][0]}),
    ("dv-v-dtype", "decode_verify", lambda a: {"v_buffer": a["v_buffer"].half()}),
    ("dv-v-leading-shape", "decode_verify", lambda a: {"v_buffer": a["v_buffer"][:4]}),
    ("dv-lv-not-pow2", "decode_verify", lambda a: {"v_buffer": a["k_buffer"][..., :48]}),
    ("dv-rope-not-pow2", "decode_verify",
     lambda a: {"k_buffer": _m(8, 16, 1, 80), "v_buffer": _m(8, 16, 1, 80)[..., :32]}),
    ("dv-q-head-dim", "decode_verify", lambda a: {"q": _m(4, 4, 32)}),
    ("dv-q-inner-stride", "decode_verify", lambda a: {"q": _m(4, 4, 128)[..., ::2]}),
    ("dv-qlen-zero", "decode_verify", lambda a: {"qlen": 0}),
    ("dv-qlen-rows", "decode_verify", lambda a: {"qlen": 3}),
    ("dv-o-dtype", "decode_verify", lambda a: {"o": a["o"].half()}),
    ("dv-o-shape", "decode_verify", lambda a: {"o": _m(4, 4, 64)}),
    ("dv-o-inner-stride", "decode_verify", lambda a: {"o": _m(4, 4, 64)[..., ::2]}),
    ("dv-lse-rank", "decode_verify", lambda a: {"lse": _m(4)}),
    ("dv-lse-shape", "decode_verify", lambda a: {"lse": _m(4, 2)}),
    ("dv-table-dtype", "decode_verify", lambda a: {"req_to_token": a["req_to_token"].long()}),
    ("dv-table-rows", "decode_verify", lambda a: {"req_to_token": a["req_to_token"][:1]}),
    ("dv-seq-lens-shape", "decode_verify", lambda a: {"seq_lens": a["seq_lens"][:1]}),
    ("dv-real-seq-lens-dtype", "decode_verify",
     lambda a: {"real_seq_lens": a["seq_lens"].float()}),
    ("dv-splits-zero", "decode_verify", lambda a: {"num_kv_splits": 0}),
    ("dv-workspace-missing", "decode_verify", lambda a: {"num_kv_splits": 2}),
    ("dv-workspace-rank", "decode_verify", lambda a: {"attn_logits": _m(4, 4, 33)}),
    ("dv-workspace-small", "decode_verify",
     lambda a: {"num_kv_splits": 2, "attn_logits": _m(4, 4, 2, 16)}),
    ("dv-workspace-inner-stride", "decode_verify",
     lambda a: {"num_kv_splits": 2, "attn_logits": _m(4, 4, 2, 66)[..., ::2]}),
    ("dv-k-scale-dtype", "decode_verify", lambda a: {"k_scale": _m(1, dtype=torch.float16)}),
    ("dv-k-scale-shape", "decode_verify", lambda a: {"k_scale": _m(2)}),
    ("dv-device", "decode_verify", lambda a: {"seq_lens": torch.zeros(2, dtype=torch.int32)}),
    # the always-on rules of the spec: index tensors with a contiguous last dim
    ("dv-table-strided", "decode_verify",
     lambda a: {"req_to_token": _m(2, 4, dtype=torch.int32)[:, ::2]}),
    ("dv-seq-lens-strided", "decode_verify",
     lambda a: {"seq_lens": _m(4, dtype=torch.int32)[::2]}),
    ("dv-real-seq-lens-strided", "decode_verify",
     lambda a: {"real_seq_lens": _m(4, dtype=torch.int32)[::2]}),
    # sm_scale finite and > 0 (the message prints it as Python's repr does)
    *[(f"dv-sm-scale-{v}", "decode_verify", (lambda v: lambda a: {"sm_scale": v})(v))
      for v in (float("nan"), float("inf"), float("-inf"), 0.0, -0.1, -1e-05, -1e20)],
    # head dims: Lv a power of two in [16, 512], rope 0 or a power of two in [16, 128]
    *[(f"dv-Lv{lv}-rope{rope}", "decode_verify",
       (lambda lv, rope: lambda a: decode_verify_args("meta", Lv=lv, rope=rope))(lv, rope))
      for lv, rope in ((1, 32), (3, 32), (8, 32), (8, 8), (8, 0), (64, 1), (64, 3), (64, 8),
                       (1024, 64), (512, 256), (48, 16))],
    # context parallelism
    ("dv-cp-world-0", "decode_verify", lambda a: {"cp_world": 0}),
    ("dv-cp-rank-negative", "decode_verify", lambda a: {"cp_rank": -1}),
    ("dv-cp-rank-1-of-1", "decode_verify", lambda a: {"cp_rank": 1}),
    ("dv-cp-rank-2-of-2", "decode_verify", lambda a: {"cp_world": 2, "cp_rank": 2}),
    ("dv-cp-interleave-0", "decode_verify", lambda a: {"cp_interleave": 0}),
    # ragged draft counts and draft trees
    ("dv-qo-indptr-dtype", "decode_verify", lambda a: {"qo_indptr": _m(3, dtype=torch.int64)}),
    ("dv-qo-indptr-rank", "decode_verify", lambda a: {"qo_indptr": _m(1, 3, dtype=torch.int32)}),
    ("dv-qo-indptr-empty", "decode_verify", lambda a: {"qo_indptr": _m(0, dtype=torch.int32)}),
    ("dv-qo-indptr-strided", "decode_verify",
     lambda a: {"qo_indptr": _m(6, dtype=torch.int32)[::2]}),
    ("dv-qo-indptr-batch", "decode_verify", lambda a: {"qo_indptr": _m(4, dtype=torch.int32)}),
    ("dv-qo-indptr-seq-lens", "decode_verify",
     lambda a: {"qo_indptr": _m(2, dtype=torch.int32)}),
    ("dv-qo-indptr-device", "decode_verify",
     lambda a: {"qo_indptr": torch.zeros(3, dtype=torch.int32)}),
    ("dv-tree-dtype", "decode_verify", lambda a: {"tree_mask": _m(4, dtype=torch.int32)}),
    ("dv-tree-rank", "decode_verify", lambda a: {"tree_mask": _m(4, 1, dtype=torch.int64)}),
    ("dv-tree-shape", "decode_verify", lambda a: {"tree_mask": _m(3, dtype=torch.int64)}),
    ("dv-tree-strided", "decode_verify", lambda a: {"tree_mask": _m(8, dtype=torch.int64)[::2]}),
    ("dv-tree-qlen-65", "decode_verify",
     lambda a: {"qlen": 65, "qo_indptr": _m(3, dtype=torch.int32),
                "tree_mask": _m(4, dtype=torch.int64)}),
    ("dv-tree-cp", "decode_verify", lambda a: {"tree_mask": _m(4, dtype=torch.int64),
                                               "cp_world": 2}),
    ("dv-tree-device", "decode_verify", lambda a: {"tree_mask": torch.zeros(4, dtype=torch.int64)}),
    ("dv-ragged-workspace-small", "decode_verify",
     lambda a: {"qo_indptr": _m(3, dtype=torch.int32), "q": _m(6, 4, 64), "o": _m(6, 4, 32),
                "lse": _m(6, 4), "num_kv_splits": 2, "attn_logits": _m(4, 4, 2, 33)}),
    # warmup_decode_verify
    ("wu-tree-qlen-65", "warmup_decode_verify", lambda a: {"has_tree": True, "qlens": [2, 65]}),
    ("wu-tree-cp", "warmup_decode_verify", lambda a: {"has_tree": True, "cp_world": 2}),
    ("wu-fp8-cache-ok-then-o-heads", "warmup_decode_verify",
     lambda a: {"k_buffer": _m(8, 16, 1, 64, dtype=FP8), "o": _m(4, 3, 32)}),
    ("wu-q-head-dim", "warmup_decode_verify", lambda a: {"q": _m(4, 4, 32)}),
    ("wu-o-lv", "warmup_decode_verify", lambda a: {"o": _m(4, 4, 48)}),
    ("wu-lse-heads", "warmup_decode_verify", lambda a: {"lse": _m(4, 3)}),
    ("wu-table-rank", "warmup_decode_verify", lambda a: {"req_to_token": _m(2, dtype=torch.int32)}),
    ("wu-qlens-empty", "warmup_decode_verify", lambda a: {"qlens": []}),
    ("wu-qlens-zero", "warmup_decode_verify", lambda a: {"qlens": [1, 0]}),
    ("wu-workspace-dtype", "warmup_decode_verify",
     lambda a: {"attn_logits": _m(4, dtype=torch.float16)}),
    ("wu-device", "warmup_decode_verify", lambda a: {"lse": torch.zeros(4, 4)}),
    # merge_attn_states / rescale_attn_partial
    ("ma-o-dtype", "merge_attn_states", lambda a: {"o": _m(3, 4, 32, dtype=torch.int32)}),
    ("ma-parts-dtype", "merge_attn_states",
     lambda a: {"o_parts": _m(2, 3, 4, 32, dtype=torch.float16)}),
    ("ma-no-parts", "merge_attn_states", lambda a: {"o_parts": _m(0, 3, 4, 32),
                                                    "lse_parts": _m(0, 3, 4)}),
    ("ma-o-shape", "merge_attn_states", lambda a: {"o": _m(3, 4, 16)}),
    ("ma-lse-parts-shape", "merge_attn_states", lambda a: {"lse_parts": _m(2, 3, 2)}),
    ("ma-lse-dtype", "merge_attn_states", lambda a: {"lse": _m(3, 4, dtype=torch.float16)}),
    ("ma-inner-stride", "merge_attn_states", lambda a: {"o_parts": _m(2, 3, 4, 64)[..., ::2]}),
    ("ra-part-range", "rescale_attn_partial", lambda a: {"part": 2}),
    ("ra-chunks", "rescale_attn_partial", lambda a: {"o_out": _m(3, 3, 1, 32)}),
    ("ra-out-shape", "rescale_attn_partial", lambda a: {"o_out": _m(3, 4, 16)}),
    ("ra-lse-out-shape", "rescale_attn_partial", lambda a: {"lse_out": _m(3, 2)}),
    ("wu-table-strided", "warmup_decode_verify",
     lambda a: {"req_to_token": _m(2, 4, dtype=torch.int32)[:, ::2]}),
    *[(f"wu-sm-scale-{v}", "warmup_decode_verify", (lambda v: lambda a: {"sm_scale": v})(v))
      for v in (float("nan"), float("inf"), 0.0, -2.5)],
    *[(f"wu-Lv{lv}-rope{rope}", "warmup_decode_verify",
       (lambda lv, rope: lambda a: warmup_args("meta", Lv=lv, rope=rope))(lv, rope))
      for lv, rope in ((8, 32), (1024, 64), (64, 8), (1, 0))],
    ("wu-cp-world-0", "warmup_decode_verify", lambda a: {"cp_world": 0}),
    ("wu-cp-rank-3-of-2", "warmup_decode_verify", lambda a: {"cp_world": 2, "cp_rank": 3}),
    ("wu-cp-interleave-0", "warmup_decode_verify", lambda a: {"cp_interleave": 0}),
    # context_attention
    ("ca-q-rank", "context_attention", lambda a: {"q": a["q"][0]}),
    ("ca-k-dtype", "context_attention", lambda a: {"k": a["k"].half()}),
    ("ca-k-head-dim", "context_attention", lambda a: {"k": _m(14, 2, 16)}),
    ("ca-v-shape", "context_attention", lambda a: {"v": _m(14, 1, 32)}),
    ("ca-k-tokens", "context_attention", lambda a: {"k": _m(10, 2, 32), "v": _m(10, 2, 32)}),
    ("ca-gqa", "context_attention", lambda a: {"k": _m(14, 3, 32), "v": _m(14, 3, 32)}),
    ("ca-o-shape", "context_attention", lambda a: {"o": _m(14, 2, 32)}),
    ("ca-v-inner-stride", "context_attention", lambda a: {"v": _m(14, 2, 64)[..., ::2]}),
    ("ca-starts-dtype", "context_attention", lambda a: {"b_start_loc": _m(2)}),
    ("ca-lens-count", "context_attention", lambda a: {"b_seq_len": _m(3, dtype=torch.int64)}),
    ("ca-max-len", "context_attention", lambda a: {"max_input_len": -1}),
    ("ca-window", "context_attention", lambda a: {"sliding_window_k": -3}),
    ("ca-sinks-shape", "context_attention", lambda a: {"sinks": _m(3)}),
    ("ca-sinks-dtype", "context_attention", lambda a: {"sinks": _m(4, dtype=torch.int32)}),
    ("ca-device", "context_attention", lambda a: {"b_seq_len": torch.tensor([5, 9])}),
    ("ca-starts-strided", "context_attention",
     lambda a: {"b_start_loc": _m(4, dtype=torch.int32)[::2]}),
    ("ca-lens-strided", "context_attention",
     lambda a: {"b_seq_len": _m(4, dtype=torch.int64)[::2]}),
    ("ca-sinks-strided", "context_attention", lambda a: {"sinks": _m(8)[::2]}),
    *[(f"ca-softmax-scale-{v}", "context_attention",
       (lambda v: lambda a: {"softmax_scale": v})(v))
      for v in (float("nan"), float("inf"), float("-inf"), 0.0, -0.5, -1e-05)],
    *[(f"ca-D{d}", "context_attention", (lambda d: lambda a: context_args("meta", D=d))(d))
      for d in (1, 3, 8, 15, 257, 512)],
]


def _bad_args(op, edit):
    args = VALID[op]("meta")
    args.update(edit(args))
    return args


# --- schemas --------------------------------------------------------------------------------

# Run in a process that never imports mla_ops: only the compiled library defines torch.ops.mla.
ONLY_LIBRARY = textwrap.dedent(r"""
    import json, sys
    import torch

    torch.ops.load_library(sys.argv[1])
    mla = torch.ops.mla
    out = {"schemas": {}, "tags": {}}
    for name in ("decode_verify", "warmup_decode_verify", "context_attention",
                 "merge_attn_states", "rescale_attn_partial"):
        op = getattr(mla, name).default
        out["schemas"][name] = str(op._schema)
        out["tags"][name] = sorted(str(t) for t in op.tags)

    def m(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    i32 = torch.int32
    cache = m(8, 16, 1, 64)
    # Each op on meta tensors of the right shapes: the Meta kernels accept them.
    mla.decode_verify(m(4, 4, 64), cache, cache[..., :32], m(4, 4, 32), m(4, 4),
                      m(2, 3, dtype=i32), m(2, dtype=i32), None, 2, m(4, 4, 2, 33), 2, 0.1, 16)
    mla.warmup_decode_verify(m(4, 4, 64), cache, m(4, 4, 32), m(4, 4), m(2, 3, dtype=i32),
                             True, [1, 2], m(4, 4, 2, 33), 0.1, 16)
    mla.context_attention(m(14, 4, 32), m(14, 2, 32), m(14, 2, 32), m(14, 4, 32),
                          m(2, dtype=i32), m(2, dtype=i32), 9)
    mla.decode_verify(m(4, 4, 64), cache, cache[..., :32], m(4, 4, 32), m(4, 4),
                      m(2, 3, dtype=i32), m(2, dtype=i32), None, 2, None, 1, 0.1, 16, None, 1, 0,
                      1)
    out["meta_calls"] = "ok"
    # The spec's always-on rules are in the C++ Meta kernels too.
    out["bad_rules"] = []
    for kw in ({"sm_scale": float("nan")}, {"seq_lens": m(4, dtype=i32)[::2]},
               {"cp_world": 2, "cp_rank": 2}):
        args = dict(q=m(4, 4, 64), k_buffer=cache, v_buffer=cache[..., :32], o=m(4, 4, 32),
                    lse=m(4, 4), req_to_token=m(2, 3, dtype=i32), seq_lens=m(2, dtype=i32),
                    real_seq_lens=None, qlen=2, attn_logits=None, num_kv_splits=1, sm_scale=0.1,
                    page_size=16)
        args.update(kw)
        try:
            mla.decode_verify(**args)
            out["bad_rules"].append(None)
        except Exception as e:
            out["bad_rules"].append([type(e).__name__, str(e)])
    # A bad shape: o one column short.
    try:
        mla.decode_verify(m(4, 4, 64), cache, cache[..., :32], m(4, 4, 31), m(4, 4),
                          m(2, 3, dtype=i32), m(2, dtype=i32), None, 2, None, 1, 0.1, 16)
        out["bad_shape"] = None
    except Exception as e:
        out["bad_shape"] = [type(e).__name__, str(e)]
    # No device kernel here: those are Python's.
    try:
        x = torch.zeros(2, 1, 16)
        mla.context_attention(x, x, x, x.clone(), torch.zeros(1, dtype=i32),
                              torch.ones(1, dtype=i32), 2)
        out["cpu_call"] = None
    except NotImplementedError as e:
        out["cpu_call"] = type(e).__name__
    # A torch.export program saved by a process with mla_ops: loads here and runs on meta.
    if len(sys.argv) > 2:
        ep = torch.export.load(sys.argv[2])
        inputs = torch.load(sys.argv[3])["inputs"]
        res = ep.module()(*[t.to("meta") for t in inputs])
        out["program"] = [[t.device.type, list(t.shape)] for t in res]
    out["mla_ops_imported"] = any(k == "mla_ops" or k.startswith("mla_ops.") for k in sys.modules)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A torch.export program calling decode_verify and context_attention, saved to disk."""
    return _export_program(str(tmp_path_factory.mktemp("export")))


@pytest.fixture(scope="module")
def only_library(exported):
    if SO is None:
        pytest.skip("mla_ops._C is not built (pure-Python install)")
    return _run(["-c", ONLY_LIBRARY, SO, *exported])


@pytest.fixture(scope="module")
def pure_python(exported):
    """The mode report of a process that imports mla_ops with MLA_OPS_NO_EXT=1."""
    code = ("import sys, json; sys.path.insert(0, 'tests'); import test_csrc_meta as t; "
            "print(json.dumps(t.mode_report(*sys.argv[1:])))")
    return _run(["-c", code, *exported], env={"MLA_OPS_NO_EXT": "1"})


class TestSchemas(expecttest.TestCase):
    def test_python_schemas_pinned(self):
        self.assertExpectedInline(
            "\n".join(f"mla::{name}{schema}" for name, schema in library.SCHEMAS.items()),
            """\
mla::decode_verify(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, Tensor? qo_indptr=None, Tensor? tree_mask=None) -> ()
mla::warmup_decode_verify(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, bool varlen=False, bool has_tree=False) -> ()
mla::context_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, int max_input_len, bool is_causal=True, float? softmax_scale=None, int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()
mla::merge_attn_states(Tensor o_parts, Tensor lse_parts, Tensor(a!) o, Tensor(b!)? lse=None) -> ()
mla::rescale_attn_partial(Tensor o_part, Tensor lse_parts, int part, Tensor(a!) o_out, Tensor(b!)? lse_out=None) -> ()""",
        )

    @needs_so
    def test_cpp_schemas_pinned_and_equal_to_python(self):
        cpp = _run(["-c", ONLY_LIBRARY, SO])
        self.assertExpectedInline(
            "\n".join(cpp["schemas"][name] for name in OPS),
            """\
mla::decode_verify(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, Tensor? qo_indptr=None, Tensor? tree_mask=None) -> ()
mla::warmup_decode_verify(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, bool varlen=False, bool has_tree=False) -> ()
mla::context_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, int max_input_len, bool is_causal=True, float? softmax_scale=None, int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()
mla::merge_attn_states(Tensor o_parts, Tensor lse_parts, Tensor(a!) o, Tensor(b!)? lse=None) -> ()
mla::rescale_attn_partial(Tensor o_part, Tensor lse_parts, int part, Tensor(a!) o_out, Tensor(b!)? lse_out=None) -> ()""",
        )
        for name in OPS:
            self.assertEqual(cpp["schemas"][name], f"mla::{name}{library.SCHEMAS[name]}")
            self.assertEqual(cpp["tags"][name], ["Tag.pt2_compliant_tag"])  # as custom_op tags


# --- a process with only the compiled library ----------------------------------------------


def test_only_library_runs_meta_and_rejects_bad_shape(only_library):
    assert not only_library["mla_ops_imported"]
    assert only_library["meta_calls"] == "ok"
    assert only_library["bad_shape"] == ["ValueError",
                                         "o: expected shape (4, 4, 32), got (4, 4, 31)"]
    assert only_library["bad_rules"] == [
        ["ValueError", "sm_scale: expected a finite positive float, got nan"],
        ["ValueError", "seq_lens: the last dimension must be contiguous (stride 1), got strides "
                       "(2,)"],
        ["ValueError", "cp_rank: expected 0 <= cp_rank < cp_world=2, got 2"],
    ]
    # Device kernels come from `import mla_ops`; the dispatcher says so for CPU tensors.
    assert only_library["cpu_call"] == "NotImplementedError"


def test_only_library_loads_and_runs_exported_program(only_library):
    assert only_library["program"] == [["meta", [4, 4, 32]], ["meta", [4, 4]],
                                       ["meta", [14, 4, 32]]]


# --- C++ Meta kernels == mla_ops.checks -----------------------------------------------------


@needs_loaded
@pytest.mark.parametrize("op", OPS)
def test_meta_kernels_accept_valid_input(op):
    args = VALID[op]("meta")
    CHECKS[op](**args)
    getattr(torch.ops.mla, op)(**args)


@needs_loaded
@pytest.mark.parametrize("case,op,edit", BAD, ids=[c[0] for c in BAD])
def test_meta_kernel_raises_what_checks_raise(case, op, edit):
    args = _bad_args(op, edit)
    with pytest.raises((ValueError, TypeError)) as python:
        CHECKS[op](**args)
    with pytest.raises((ValueError, TypeError)) as cpp:  # the C++ Meta kernel
        getattr(torch.ops.mla, op)(**args)
    assert (type(cpp.value), str(cpp.value)) == (type(python.value), str(python.value))


@needs_loaded
def test_meta_kernels_trace_dynamic_shapes_without_recompiling():
    from torch._dynamo.testing import CompileCounterWithBackend

    def step(q, k_buffer, o, lse, req_to_token, seq_lens, x, k, y, starts, lens):
        torch.ops.mla.decode_verify(q, k_buffer, k_buffer[..., :32], o, lse, req_to_token,
                                    seq_lens, None, 2, None, 1, 0.1352, 16)
        torch.ops.mla.context_attention(x, k, k, y, starts, lens, 16)
        return o.sum() + y.sum()

    def inputs(B, total):
        a = decode_verify_args(B=B)
        x, k, y = (torch.randn(total, 4, 32), torch.randn(total, 2, 32), torch.zeros(total, 4, 32))
        starts = torch.tensor([0, total // 2], dtype=torch.int32)
        lens = torch.tensor([total // 2, total - total // 2], dtype=torch.int32)
        return (a["q"], a["k_buffer"], a["o"], a["lse"], a["req_to_token"], a["seq_lens"], x, k,
                y, starts, lens)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    with interpret(False):
        # Sizes picked so that no two dims coincide (duck sizing would equate them).
        for B, total in ((5, 11), (7, 13), (9, 17)):
            args = inputs(B, total)
            got = compiled(*args)
            torch.testing.assert_close(got, step(*args))
    assert counter.frame_count == 1  # batch and token counts stayed symbolic in the Meta kernels


@needs_loaded
def test_cpp_side_defines_python_side_only_adds_device_kernels():
    for name in OPS:
        dump = torch._C._dispatch_dump(f"mla::{name}")
        schema_line = next(line for line in dump.splitlines() if "debug:" in line)
        assert "mla_meta.cpp" in schema_line, dump  # the schema was def'ed by csrc_meta
        origins = {"Meta": "mla_meta.cpp", "Autograd": "mla_meta.cpp",
                   "BackendSelect": "mla_meta.cpp",  # the replays (mla_replay.cpp)
                   "CPU": "mla_ops/library.py", "CUDA": "mla_ops/library.py"}
        if name != "warmup_decode_verify":  # mutates nothing: no version to bump
            origins["ADInplaceOrView"] = "mla_meta.cpp"
        active = {line.split(":")[0].replace("[alias]", ""): line
                  for line in dump.splitlines() if "registered at" in line and
                  not line.startswith("debug") and "(inactive)" not in line}
        assert set(active) == set(origins), dump  # nothing else, nothing twice
        for key, origin in origins.items():
            assert origin in active[key], (name, key, active[key])


# --- both modes: the same observable behaviour ---------------------------------------------


def _export_program(directory: str) -> tuple[str, str]:
    class Step(torch.nn.Module):
        def forward(self, q, k_buffer, req_to_token, seq_lens, x, starts, lens):
            o = q.new_empty(q.shape[0], q.shape[1], 32)
            lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)
            torch.ops.mla.decode_verify(q, k_buffer, k_buffer[..., :32], o, lse, req_to_token,
                                        seq_lens, None, 2, None, 1, 0.1352, 16)
            y = torch.zeros_like(x)
            torch.ops.mla.context_attention(x, x[:, :2], x[:, :2], y, starts, lens, 9, False)
            return o, lse, y

    a, c = decode_verify_args(), context_args()
    inputs = (a["q"], a["k_buffer"], a["req_to_token"], a["seq_lens"], c["q"],
              c["b_start_loc"], c["b_seq_len"])
    with interpret(False):
        expected = Step()(*inputs)
        program = torch.export.export(Step(), inputs)
    path, data = os.path.join(directory, "step.pt2"), os.path.join(directory, "io.pt")
    torch.export.save(program, path)
    torch.save({"inputs": inputs, "expected": expected}, data)
    return path, data


def mode_report(program: str | None = None, data: str | None = None) -> dict:
    """Everything observable about how torch.ops.mla is registered in this process (JSON)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._subclasses.fake_tensor import FakeTensorMode

    report: dict = {"extension": library.EXTENSION is not None,
                    "status": library.EXTENSION_STATUS}
    report["schemas"] = {n: str(getattr(torch.ops.mla, n).default._schema) for n in OPS}
    report["tags"] = {n: sorted(str(t) for t in getattr(torch.ops.mla, n).default.tags)
                      for n in OPS}
    report["keys"] = {
        n: [k for k in ("Meta", "CPU", "CUDA", "Autograd", "ADInplaceOrView")
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"mla::{n}", k)]
        for n in OPS
    }
    with interpret(False):
        # opcheck: Lv == Lk where aot_dispatch runs the kernel on copies of the inputs (a copy
        # of a narrower view is no view of the cache), and the strided view without it.
        cases = {
            "decode_verify-split1": (decode_verify_args(Lv=64, rope=0), "all"),
            "decode_verify-split2": (decode_verify_args(Lv=64, rope=0, splits=2), "all"),
            "decode_verify-view": (decode_verify_args(), ("test_schema", "test_faketensor")),
            "warmup_decode_verify": (warmup_args(), "all"),
            "context_attention": (context_args(), "all"),
        }
        report["opcheck"] = {}
        for case, (kwargs, utils) in cases.items():
            op = getattr(torch.ops.mla, case.split("-")[0]).default
            kw = {} if utils == "all" else {"test_utils": utils}
            report["opcheck"][case] = torch.library.opcheck(op, (), kwargs, **kw)

        # Inference-only: refused with grad, runs under no_grad, bumps o's version.
        args = decode_verify_args()
        args["q"].requires_grad_(True)
        try:
            torch.ops.mla.decode_verify(**args)
            report["grad_error"] = None
        except RuntimeError as e:
            report["grad_error"] = str(e)
        with torch.no_grad():
            before = args["o"]._version
            torch.ops.mla.decode_verify(**args)
            report["o_version_bumped"] = args["o"]._version > before

        # Fake mode (what torch.compile traces with): a bad shape raises the checks' error.
        with FakeTensorMode() as mode:
            fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                    for k, v in decode_verify_args().items()}
            torch.ops.mla.decode_verify(**fake)
            fake_lse = fake["lse"]
            fake["lse"] = torch.empty(4, 3)
            try:
                torch.ops.mla.decode_verify(**fake)
                report["fake_error"] = None
            except ValueError as e:
                report["fake_error"] = str(e)
            # ... and so do the spec's always-on rules (messages as the C++ side words them).
            report["fake_rule_errors"] = []
            for change in ({"sm_scale": float("inf")}, {"cp_interleave": 0},
                           {"seq_lens": mode.from_tensor(torch.zeros(4, dtype=torch.int32))[::2]},
                           {"q": mode.from_tensor(torch.zeros(4, 4, 8)),
                            "k_buffer": mode.from_tensor(torch.zeros(8, 16, 1, 8)),
                            "v_buffer": mode.from_tensor(torch.zeros(8, 16, 1, 8))[..., :4],
                            "o": mode.from_tensor(torch.zeros(4, 4, 4))}):
                try:
                    torch.ops.mla.decode_verify(**{**fake, "lse": fake_lse, **change})
                    report["fake_rule_errors"].append(None)
                except (ValueError, TypeError) as e:
                    report["fake_rule_errors"].append(str(e))

        # torch.compile(fullgraph=True, dynamic=True) matches eager, one frame for two batches.
        def step(q, k_buffer, req_to_token, seq_lens):
            o = q.new_empty(q.shape[0], q.shape[1], 32)
            lse = q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)
            torch.ops.mla.decode_verify(q * 2, k_buffer, k_buffer[..., :32], o, lse,
                                        req_to_token, seq_lens, None, 2, None, 1, 0.1352, 16)
            return o, lse

        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
        same = []
        for B in (5, 7):  # no size equal to another (duck sizing would equate them)
            a = decode_verify_args(B=B)
            args4 = (a["q"], a["k_buffer"], a["req_to_token"], a["seq_lens"])
            same.append(all(torch.equal(x, y) for x, y in zip(compiled(*args4), step(*args4))))
        report["compile"] = {"matches_eager": same, "frames": counter.frame_count}

        # The saved torch.export program loads and runs here, after `import mla_ops`.
        if program is not None:
            loaded = torch.export.load(program)
            io = torch.load(data)
            got = loaded.module()(*io["inputs"])
            report["program_matches"] = [torch.equal(x, y) for x, y in zip(got, io["expected"])]
    return report


def _check_report(report: dict) -> None:
    for name in OPS:
        assert report["schemas"][name] == f"mla::{name}{library.SCHEMAS[name]}"
        assert report["tags"][name] == ["Tag.pt2_compliant_tag"]
        assert report["keys"][name] == ["Meta", "CPU", "CUDA", "Autograd"] + (
            [] if name == "warmup_decode_verify" else ["ADInplaceOrView"])
    for case, result in report["opcheck"].items():
        assert set(result.values()) == {"SUCCESS"}, (case, result)
    assert report["grad_error"] == (
        "mla::decode_verify is inference-only (no autograd formula is registered), but q "
        "requires grad: call it under torch.no_grad() or torch.inference_mode(), or pass "
        "tensors that do not require grad"
    )
    assert report["o_version_bumped"]
    assert report["fake_error"] == "lse: expected shape (4, 4), got (4, 3)"
    assert report["fake_rule_errors"] == [
        "sm_scale: expected a finite positive float, got inf",
        "cp_interleave: expected an int >= 1, got 0",
        "seq_lens: the last dimension must be contiguous (stride 1), got strides (2,)",
        "v_buffer: expected Lk = Lv + rope with Lv a power of two in [16, 512] and rope 0 or a "
        "power of two in [16, 128] (576 = 512 + 64), got Lk=8, Lv=4",
    ]
    assert report["compile"] == {"matches_eager": [True, True], "frames": 1}
    assert report["program_matches"] == [True, True, True]


@pytest.fixture(scope="module")
def this_process(exported):
    return mode_report(*exported)


def test_this_process(this_process):
    """This process: the C++ side when mla_ops._C is built, else pure Python."""
    assert this_process["extension"] == LOADED
    _check_report(this_process)


def test_pure_python_mode_subprocess(pure_python):
    """MLA_OPS_NO_EXT=1: custom_op defines everything, even with mla_ops._C built."""
    assert pure_python["extension"] is False
    _check_report(pure_python)


@needs_loaded
def test_both_modes_agree(this_process, pure_python):
    differ = {k for k in this_process if this_process[k] != pure_python[k]}
    assert differ == {"extension", "status"}


# Library.impl as torch 2.8 to 2.12 have it: they refuse to override another Python Library's
# kernel unless allow_override=True (torch 2.13 allows it; before 2.8 is not supported).
OLDER_LIBRARY_IMPL = {
    "torch-2.8-to-2.12": textwrap.dedent("""
        def impl(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=False):
            return orig(self, op_name, fn, dispatch_key, with_keyset=with_keyset,
                        allow_override=allow_override)
    """),
}


@pytest.mark.parametrize("torch_version", list(OLDER_LIBRARY_IMPL))
def test_pure_python_mode_imports_with_older_library_impl(torch_version):
    """custom_op's Autograd kernel is replaced on every torch the package supports."""
    code = "\n".join([
        "import json, torch",
        "orig = torch.library.Library.impl",
        OLDER_LIBRARY_IMPL[torch_version],
        "torch.library.Library.impl = impl",
        "import mla_ops",
        "q = torch.randn(4, 2, 16, requires_grad=True)",
        "i32 = torch.int32",
        "try:",
        "    torch.ops.mla.context_attention(q, q, q, torch.empty(4, 2, 16),",
        "        torch.tensor([0], dtype=i32), torch.tensor([4], dtype=i32), 4)",
        "    err = None",
        "except RuntimeError as e:",
        "    err = str(e)",
        "print(json.dumps({'extension': mla_ops.library.EXTENSION, 'error': err}))",
    ])
    out = _run(code, env={"MLA_OPS_NO_EXT": "1"})
    assert out["extension"] is None
    assert out["error"].startswith("mla::context_attention is inference-only")


def _package_copy(tmp_path, status: str | None = None):
    """This package without its built library (and with ``status`` as its build record)."""
    shutil.copytree(os.path.join(ROOT, "mla_ops"), tmp_path / "mla_ops",
                    ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    if status is not None:
        (tmp_path / "mla_ops" / "_C.status").write_text(status + "\n")


_REPORT = ("import json, warnings\n"
           "with warnings.catch_warnings(record=True) as w:\n"
           "    warnings.simplefilter('always')\n"
           "    import mla_ops, torch\n"
           "print(json.dumps({'file': mla_ops.__file__, 'extension': mla_ops.library.EXTENSION,"
           " 'status': mla_ops.library.EXTENSION_STATUS,"
           " 'warnings': [str(x.message) for x in w if 'mla_ops' in str(x.message)],"
           " 'schema': str(torch.ops.mla.context_attention.default._schema)}))")


def test_a_library_that_does_not_load_falls_back_to_pure_python(tmp_path):
    """A _C built against another torch (undefined symbols) warns and leaves pure Python."""
    _package_copy(tmp_path)
    suffix = __import__("importlib.machinery").machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "mla_ops" / f"_C{suffix}").write_bytes(b"not a shared library")
    out = _run(_REPORT, env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert out["file"].startswith(str(tmp_path))
    assert out["extension"] is None
    assert len(out["warnings"]) == 1 and "using the pure-Python registration" in out["warnings"][0]
    assert out["schema"] == f"mla::context_attention{library.SCHEMAS['context_attention']}"
    assert out["status"].startswith("pure-Python registration (mla_ops._C did not load: ")
    assert "\n" not in out["status"]


@pytest.mark.parametrize("record", [None, "pure-Python install (no mla_ops._C): building "
                                          "mla_ops._C failed (CompileError: cc refused)"],
                         ids=["no-record", "build-failed"])
def test_extension_status_says_why_there_is_no_library(tmp_path, record):
    _package_copy(tmp_path, record)
    out = _run(_REPORT, env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert out["extension"] is None and out["warnings"] == []
    why = record or "no build record: installed without running setup.py's build_ext"
    assert out["status"] == f"pure-Python registration (mla_ops._C not built: {why})"


def test_extension_status_of_this_process_and_of_no_ext(pure_python):
    """One line: which side defined the ops, and (pure Python) why."""
    if LOADED:
        assert library.EXTENSION_STATUS == f"C++ schemas and Meta kernels from {SO}"
    else:
        assert library.EXTENSION_STATUS.startswith("pure-Python registration (")
    assert pure_python["status"] == "pure-Python registration (MLA_OPS_NO_EXT is set)"


# --- setup.py -------------------------------------------------------------------------------


def _source_copy(tmp_path):
    for name in ("setup.py", "csrc_meta", "mla_ops"):
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, tmp_path / name,
                            ignore=shutil.ignore_patterns("_C*", "__pycache__"))
        else:
            shutil.copy(src, tmp_path / name)


_BUILD = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", "lib", "--build-temp",
          "tmp"]


def test_setup_falls_back_to_pure_python_when_the_compile_fails(tmp_path):
    """A broken toolchain must leave a working pure-Python build, not a failed install, and say
    why in one line (also recorded in _C.status)."""
    _source_copy(tmp_path)
    cc = tmp_path / "cc"  # answers version queries like g++, refuses to compile
    cc.write_text('#!/bin/sh\ncase "$*" in *.cpp*) echo "refusing" >&2; exit 1;; esac\n'
                  f'exec {shutil.which("g++") or shutil.which("c++") or "false"} "$@"\n')
    cc.chmod(0o755)
    env = {**os.environ, "CC": str(cc), "CXX": str(cc)}
    env.pop("MLA_OPS_NO_EXT", None)
    proc = subprocess.run(_BUILD, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("mla_ops setup: ")]
    # The compiler's own failure (the spec was generated into the build tree first).
    assert len(said) == 1 and said[0].startswith(
        "mla_ops setup: pure-Python install (no mla_ops._C): building mla_ops._C failed "
        "(CompileError: "), said
    assert "refusing" in proc.stderr
    assert not list(tmp_path.glob("lib/**/_C*.so"))
    status = (tmp_path / "lib" / "mla_ops" / "_C.status").read_text()
    assert status == said[0].removeprefix("mla_ops setup: ") + "\n"
    generated = (tmp_path / "tmp" / "generated" / "mla_spec_generated.inc").read_text()
    assert generated == spec.cpp_source()

    env["MLA_OPS_NO_EXT"] = "1"
    proc = subprocess.run(_BUILD, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("mla_ops setup: pure-Python install (no mla_ops._C): MLA_OPS_NO_EXT is set"
            in proc.stderr.splitlines())
    assert (tmp_path / "lib" / "mla_ops" / "_C.status").read_text() == (
        "pure-Python install (no mla_ops._C): MLA_OPS_NO_EXT is set\n")


def test_spec_prints_the_generated_sources():
    """``python -m mla_ops.spec --cpp`` prints what setup.py compiles, ``--python`` the checks
    (one function per op, each rule once)."""
    cpp = subprocess.run([sys.executable, "-m", "mla_ops.spec", "--cpp"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert cpp.returncode == 0, cpp.stderr
    assert cpp.stdout == spec.cpp_source()
    for name in OPS:
        assert f"void {name}_meta(" in cpp.stdout
    py = subprocess.run([sys.executable, "-m", "mla_ops.spec", "--python"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert py.returncode == 0, py.stderr
    assert py.stdout == "\n".join(spec.python_source(op) for op in spec.OPS.values())
    assert py.stdout.count("sm_scale: expected a finite positive float") == 2
