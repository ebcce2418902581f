"""The argument spec of every ``torch.ops.mla`` op: one declaration, three checkers.

Each op is declared once, below, as its schema plus an ordered list of rules: a condition, the
exception it raises (``ValueError`` for shapes and values, ``TypeError`` for dtypes) and the
message, which always starts with the argument's name. Conditions and messages are written in a
small subset of Python (attribute reads such as ``x.shape[-1]``, ``x.stride(0)``, ``x.dim()``,
``x.dtype``, arithmetic, comparisons, ``and``/``or``/``not``, ``a if c else b``, and the helpers
in :data:`HELPERS`), which is

* compiled into one plain Python function per op (:func:`python_checks`): the checks of the
  public functions, and the fake implementations of the ops;
* translated into C++ (:func:`cpp_source`) at build time: the Meta kernels of ``mla_ops._C``, so
  that a process which only loads the C++ library (no Python package) gives the same errors.

Every rule reads metadata only (dtype, rank, shape, stride, device), so the checks run
unchanged on real, fake and meta tensors, never synchronise the device, and raise before any
launch. Rules about the data itself (page indices, lengths) live in :mod:`mla_ops.checked`.

This module imports neither torch nor triton at import time: ``setup.py`` loads it by path to
generate the C++ side before anything is installed.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import string
from typing import Any, Callable

# --- dtype sets (names as torch spells them) -----------------------------------------------

_ACT = ("float16", "bfloat16", "float32")
_FP8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")

DTYPE_SETS = {
    "ACT": _ACT,
    "FP8": _FP8,  # mla_ops.numerics.FP8_DTYPES: these, as this torch's dtypes
    "CACHE": _ACT + _FP8,
    "INT32": ("int32",),
    "INT64": ("int64",),
    "INDEX": ("int32", "int64"),
    "F32": ("float32",),
}

# Head dims the kernels are built and tested for (the launchers' tiles need a dot's K >= 16;
# wider heads exceed registers and shared memory). Past these, a clear error, never a compile
# error.
VERIFY_LV = (16, 512)
VERIFY_ROPE = (16, 128)
PREFILL_D = (16, 256)


@dataclasses.dataclass(frozen=True)
class Rule:
    """``cond`` must hold (when ``when`` holds) or ``exc`` is raised with ``msg`` formatted.

    ``kind``: ``"check"``; ``"let"`` binds ``name = cond`` for the rules after it; ``"each"``
    checks ``cond`` for every element ``name`` of the list argument ``over``.
    """

    kind: str
    cond: str
    exc: str = "ValueError"
    msg: str = ""
    when: str | None = None
    name: str | None = None
    over: str | None = None


def check(cond, msg, exc="ValueError", when=None) -> Rule:
    return Rule("check", cond, exc, msg, when)


def let(name, expr) -> Rule:
    return Rule("let", expr, name=name)


def dims(x, *names) -> list[Rule]:
    """Binds ``names[i] = x.shape[i]``."""
    return [let(n, f"{x}.shape[{i}]") for i, n in enumerate(names)]


def each(over, name, cond, msg, exc="ValueError", when=None) -> Rule:
    return Rule("each", cond, exc, msg, when, name=name, over=over)


def tensor(x, rank=None, dtypes=None, sizes=None, inner=False, optional=False,
           when=None) -> list[Rule]:
    """The rules of tensor argument ``x``, in this order: rank (an int, a tuple, or an
    expression), dtype (a :data:`DTYPE_SETS` name, or an expression such as ``"q.dtype"``),
    ``sizes`` (the whole shape, as expressions), and with ``inner`` a last dimension of stride 1
    (index tensors included: kernels read them so). ``optional``: only when ``x`` is not None
    (and ``when`` holds, if given)."""
    if optional:
        when = f"{x} is not None" + (f" and ({when})" if when else "")
    rules = []
    rank = (rank,) if isinstance(rank, int) else rank
    if isinstance(rank, tuple):
        want = " or ".join(f"{r}-D" for r in rank)
        rules.append(check(f"{x}.dim() in {rank!r}",
                           f"{x}: expected a {want} tensor, got shape {{shape({x})}}", when=when))
    elif rank is not None:
        rules.append(check(f"{x}.dim() == {rank}",
                           f"{x}: expected a {{{rank}}}-D tensor, got shape {{shape({x})}}",
                           when=when))
    if dtypes in DTYPE_SETS:
        names = ", ".join(DTYPE_SETS[dtypes])
        rules.append(check(f"{x}.dtype in {dtypes}",
                           f"{x}: expected dtype in ({names}), got {{dtype({x}.dtype)}}",
                           "TypeError", when))
    elif dtypes is not None:
        rules.append(check(f"{x}.dtype == {dtypes}",
                           f"{x}: expected dtype in ({{dtype_name({dtypes})}}), got "
                           f"{{dtype({x}.dtype)}}", "TypeError", when))
    if sizes is not None:
        tup = f"tup({', '.join(sizes)})"
        rules.append(check(f"shape({x}) == {tup}",
                           f"{x}: expected shape {{{tup}}}, got {{shape({x})}}", when=when))
    if inner:
        rules.append(check(f"not ({x}.shape[-1] > 1 and {x}.stride(-1) != 1)",
                           f"{x}: the last dimension must be contiguous (stride 1), got strides "
                           f"{{strides({x})}}", when=when))
    return rules


def at_least(x, minimum, when=None) -> Rule:
    return check(f"{x} >= {minimum}", f"{x}: expected an int >= {minimum}, got {{{x}}}", when=when)


def positive_finite(x, when=None) -> Rule:
    return check(f"finite({x}) and {x} > 0",
                 f"{x}: expected a finite positive float, got {{flt({x})}}", when=when)


def same_device(ref, *names) -> list[Rule]:
    return [check(f"{n}.device == {ref}.device",
                  f"{n}: expected a tensor on {{{ref}.device}} (the device of {ref}), got "
                  f"{{{n}.device}}", when=f"{n} is not None")
            for n in names]


def pow2_in(x, lo, hi) -> str:
    return f"(pow2({x}) and {lo} <= {x} <= {hi})"


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    schema: str  # "(Tensor q, ...) -> ()", as torch.library writes it
    rules: tuple[Rule, ...]
    returns: tuple[str, ...] = ()  # let-bound names the Python check returns (launchers use them)

    @property
    def mutates(self) -> tuple[str, ...]:
        return tuple(a.name for a in parse_schema(self.schema) if a.written)


def _rules(*groups) -> tuple[Rule, ...]:
    out = []
    for g in groups:
        out.extend(_rules(*g) if isinstance(g, list) else [g])
    return tuple(out)


def _cache_rules(cache_dtype_ref: str) -> list:
    """``k_buffer`` ``[num_pages, page_size, 1, Lk]`` or ``[num_pages * page_size, 1, Lk]``."""
    return [
        tensor("k_buffer", (3, 4), "CACHE", inner=True),
        check("k_buffer.shape[-2] == 1",
              "k_buffer: expected one latent KV head (shape[-2] == 1), got shape "
              "{shape(k_buffer)}"),
        at_least("page_size", 1),
        check("k_buffer.shape[1] == page_size",
              "page_size: {page_size} does not match k_buffer's pages of {k_buffer.shape[1]} "
              "tokens (shape {shape(k_buffer)})", when="k_buffer.dim() == 4"),
        check("k_buffer.shape[0] % page_size == 0",
              "page_size: a 3-D k_buffer of {k_buffer.shape[0]} tokens is not a whole number of "
              "pages of {page_size}", when="k_buffer.dim() == 3"),
        check("not (page_size > 1 and k_buffer.shape[0] > page_size and k_buffer.stride(0) == 0)",
              "k_buffer: token stride 0 is not a valid cache layout", when="k_buffer.dim() == 3"),
        check(f"k_buffer.dtype in FP8 or k_buffer.dtype == {cache_dtype_ref}.dtype",
              f"k_buffer: expected the dtype of {cache_dtype_ref} "
              f"({{dtype({cache_dtype_ref}.dtype)}}) or an fp8 dtype, got {{dtype(k_buffer.dtype)}}",
              "TypeError"),
    ]


def _scale_and_cp_rules() -> list:
    """``sm_scale``, ``k_scale`` (it dequantizes an fp8 cache and is ignored for a 16-bit one,
    on every path) and the context-parallel layout of the two verify ops."""
    return [
        positive_finite("sm_scale"),
        tensor("k_scale", None, "F32", optional=True),
        check("k_scale.numel() == 1", "k_scale: expected a scalar tensor, got shape "
              "{shape(k_scale)}", when="k_scale is not None"),
        at_least("cp_world", 1),
        check("0 <= cp_rank and cp_rank < cp_world",
              "cp_rank: expected 0 <= cp_rank < cp_world={cp_world}, got {cp_rank}"),
        at_least("cp_interleave", 1),
    ]


def _latent_dims_rule(lv_arg: str) -> Rule:
    return check(
        f"{pow2_in('Lv', *VERIFY_LV)} and (rope == 0 or {pow2_in('rope', *VERIFY_ROPE)})",
        f"{lv_arg}: expected Lk = Lv + rope with Lv a power of two in [{VERIFY_LV[0]}, "
        f"{VERIFY_LV[1]}] and rope 0 or a power of two in [{VERIFY_ROPE[0]}, {VERIFY_ROPE[1]}] "
        f"(576 = 512 + 64), got Lk={{Lk}}, Lv={{Lv}}")


DECODE_VERIFY = OpSpec(
    "decode_verify",
    "(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, "
    "Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, "
    "Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, "
    "Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, "
    "Tensor? qo_indptr=None, Tensor? tree_mask=None) -> ()",
    _rules(
        tensor("q", 3, "ACT", inner=True),
        _cache_rules("q"),
        tensor("v_buffer", "k_buffer.dim()"),
        check("v_buffer.dtype == k_buffer.dtype",
              "v_buffer: expected the dtype of k_buffer ({dtype(k_buffer.dtype)}), got "
              "{dtype(v_buffer.dtype)}", "TypeError"),
        # V is read from K (only v_buffer's width is used), so its strides are not checked:
        # traced graphs hand the op a functionalized copy rather than the view.
        check("lead(v_buffer) == lead(k_buffer)",
              "v_buffer: expected k_buffer[..., :Lv] with leading shape {lead(k_buffer)}, got "
              "shape {shape(v_buffer)}"),
        let("Lk", "k_buffer.shape[-1]"),
        let("Lv", "v_buffer.shape[-1]"),
        let("rope", "Lk - Lv"),
        _latent_dims_rule("v_buffer"),
        check("q.shape[2] == Lk",
              "q: expected head dim Lk={Lk} (k_buffer.shape[-1]), got shape {shape(q)}"),
        at_least("qlen", 1),
        dims("q", "rows", "heads"),
        # Ragged draft counts: request b's rows are q[qo_indptr[b]:qo_indptr[b+1]] (at most qlen
        # of them), so B comes from qo_indptr and q may have any number of rows (checked mode
        # reads qo_indptr[B] <= rows).
        tensor("qo_indptr", 1, "INT32", inner=True, optional=True),
        check("qo_indptr.shape[0] >= 1",
              "qo_indptr: expected [B+1] offsets (at least one), got shape {shape(qo_indptr)}",
              when="qo_indptr is not None"),
        check("rows % qlen == 0",
              "qlen: q has {rows} rows, not a multiple of qlen={qlen} (rows are [B*qlen, ...])",
              when="qo_indptr is None"),
        let("batch", "rows // qlen if qo_indptr is None else qo_indptr.shape[0] - 1"),
        tensor("o", 3, "q.dtype", ("rows", "heads", "Lv"), inner=True),
        tensor("lse", 2, "F32", ("rows", "heads")),
        tensor("req_to_token", 2, "INT32", inner=True),
        check("req_to_token.shape[0] >= batch",
              "req_to_token: expected one row per request ({batch}), got shape "
              "{shape(req_to_token)}"),
        tensor("seq_lens", 1, "INT32", ("batch",), inner=True),
        tensor("real_seq_lens", 1, "INT32", ("batch",), inner=True, optional=True),
        at_least("num_kv_splits", 1),
        check("attn_logits is not None",
              "attn_logits: a workspace is required when num_kv_splits={num_kv_splits} > 1",
              when="num_kv_splits > 1"),
        tensor("attn_logits", 4, "F32", optional=True),
        check("attn_logits.shape[0] >= rows and attn_logits.shape[1] == heads and "
              "attn_logits.shape[2] == num_kv_splits and attn_logits.shape[3] >= Lv + 1",
              "attn_logits: workspace too small for num_kv_splits={num_kv_splits}: expected "
              "[rows of q, H, num_kv_splits, Lv+1] = {tup(rows, heads, num_kv_splits, Lv + 1)} "
              "(at least), got {shape(attn_logits)}",
              when="attn_logits is not None and num_kv_splits > 1"),
        tensor("attn_logits", inner=True, when="attn_logits is not None and num_kv_splits > 1"),
        _scale_and_cp_rules(),
        # Draft trees: bit j of row r's mask = the row sees draft token j of its request.
        tensor("tree_mask", 1, "INT64", ("rows",), inner=True, optional=True),
        check("qlen <= 64",
              "tree_mask: a request's draft tokens are the bits of one int64, so qlen must be at "
              "most 64, got qlen={qlen}", when="tree_mask is not None"),
        check("cp_world == 1",
              "tree_mask: draft trees are not supported with context parallelism (cp_world="
              "{cp_world}): a rank's local keys are not its request's draft positions; verify "
              "trees on one GPU", when="tree_mask is not None"),
        same_device("q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "seq_lens",
                    "real_seq_lens", "attn_logits", "k_scale", "qo_indptr", "tree_mask"),
    ),
    returns=("batch", "heads", "Lk", "Lv"),
)

WARMUP_DECODE_VERIFY = OpSpec(
    "warmup_decode_verify",
    "(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, "
    "int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, Tensor? k_scale=None, "
    "int cp_world=1, int cp_rank=0, int cp_interleave=1, bool varlen=False, "
    "bool has_tree=False) -> ()",
    _rules(
        tensor("q", 3, "ACT", inner=True),
        _cache_rules("q"),
        let("Lk", "k_buffer.shape[-1]"),
        check("q.shape[2] == Lk",
              "q: expected head dim Lk={Lk} (k_buffer.shape[-1]), got shape {shape(q)}"),
        tensor("o", 3, "q.dtype", inner=True),
        let("Lv", "o.shape[-1]"),
        let("rope", "Lk - Lv"),
        _latent_dims_rule("o"),
        check("o.shape[1] == q.shape[1]",
              "o: expected {q.shape[1]} heads (q.shape[1]), got shape {shape(o)}"),
        tensor("lse", 2, "F32"),
        check("lse.shape[1] == q.shape[1]",
              "lse: expected {q.shape[1]} heads (q.shape[1]), got shape {shape(lse)}"),
        tensor("req_to_token", 2, "INT32", inner=True),
        check("len(qlens) >= 1", "qlens: expected a non-empty list of ints, got {qlens}"),
        each("qlens", "t", "t >= 1", "qlens: expected ints >= 1, got {qlens}"),
        tensor("attn_logits", None, "F32", optional=True),
        _scale_and_cp_rules(),
        each("qlens", "t", "t <= 64",
             "has_tree: a request's draft tokens are the bits of one int64, so every qlen must "
             "be at most 64, got {qlens}", when="has_tree"),
        check("cp_world == 1",
              "has_tree: draft trees are not supported with context parallelism (cp_world="
              "{cp_world})", when="has_tree"),
        same_device("q", "k_buffer", "o", "lse", "req_to_token", "attn_logits", "k_scale"),
    ),
)

CONTEXT_ATTENTION = OpSpec(
    "context_attention",
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, "
    "int max_input_len, bool is_causal=True, float? softmax_scale=None, "
    "int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()",
    _rules(
        tensor("q", 3, "ACT", inner=True),
        tensor("k", 3, "q.dtype", inner=True),
        tensor("v", 3, "q.dtype", inner=True),
        tensor("o", 3, "q.dtype", inner=True),
        dims("q", "total", "hq", "d"),
        check(f"{PREFILL_D[0]} <= d and d <= {PREFILL_D[1]}",
              f"q: expected a head dim in [{PREFILL_D[0]}, {PREFILL_D[1]}], got shape {{shape(q)}}"),
        check("k.shape[2] == d", "k: expected head dim {d} (q.shape[2]), got shape {shape(k)}"),
        check("shape(v) == shape(k)", "v: expected the shape of k {shape(k)}, got {shape(v)}"),
        check("k.shape[0] == total",
              "k: expected {total} tokens (q.shape[0]), got shape {shape(k)}"),
        let("hkv", "k.shape[1]"),
        check("not (hkv == 0 or hq % hkv != 0)",
              "k: query heads ({hq}) must be a multiple of KV heads ({hkv})"),
        tensor("o", sizes=("total", "hq", "d")),
        tensor("b_start_loc", 1, "INDEX", inner=True),
        tensor("b_seq_len", 1, "INDEX", inner=True),
        check("b_start_loc.shape[0] == b_seq_len.shape[0]",
              "b_seq_len: expected one length per start in b_start_loc "
              "({b_start_loc.shape[0]}), got {b_seq_len.shape[0]}"),
        at_least("max_input_len", 0),
        positive_finite("softmax_scale", when="softmax_scale is not None"),
        at_least("sliding_window_q", 0, when="sliding_window_q is not None"),
        at_least("sliding_window_k", 0, when="sliding_window_k is not None"),
        tensor("sinks", 1, "ACT", ("hq",), inner=True, optional=True),
        same_device("q", "k", "v", "o", "b_start_loc", "b_seq_len", "sinks"),
    ),
    returns=("hq", "hkv", "d"),
)

MERGE_ATTN_STATES = OpSpec(
    "merge_attn_states",
    "(Tensor o_parts, Tensor lse_parts, Tensor(a!) o, Tensor(b!)? lse=None) -> ()",
    _rules(
        tensor("o", 3, "ACT", inner=True),
        tensor("o_parts", 4, inner=True),
        check("o_parts.dtype == o.dtype or o_parts.dtype in F32",
              "o_parts: expected the dtype of o ({dtype(o.dtype)}) or float32, got "
              "{dtype(o_parts.dtype)}", "TypeError"),
        dims("o_parts", "parts", "rows", "heads", "dim"),
        check("parts >= 1", "o_parts: expected at least one partial (shape[0] >= 1), got shape "
              "{shape(o_parts)}"),
        tensor("o", sizes=("rows", "heads", "dim")),
        tensor("lse_parts", 3, "F32", ("parts", "rows", "heads")),
        tensor("lse", 2, "F32", ("rows", "heads"), optional=True),
        same_device("o", "o_parts", "lse_parts", "lse"),
    ),
    returns=("parts", "rows", "heads", "dim"),
)

RESCALE_ATTN_PARTIAL = OpSpec(
    "rescale_attn_partial",
    "(Tensor o_part, Tensor lse_parts, int part, Tensor(a!) o_out, Tensor(b!)? lse_out=None) "
    "-> ()",
    _rules(
        tensor("o_part", 3, "ACT", inner=True),
        dims("o_part", "rows", "heads", "dim"),
        tensor("lse_parts", 3, "F32"),
        let("parts", "lse_parts.shape[0]"),
        check("parts >= 1", "lse_parts: expected at least one partial (shape[0] >= 1), got "
              "shape {shape(lse_parts)}"),
        tensor("lse_parts", sizes=("parts", "rows", "heads")),
        check("0 <= part and part < parts",
              "part: expected 0 <= part < {parts} (lse_parts.shape[0]), got {part}"),
        tensor("o_out", (3, 4), "ACT", inner=True),
        tensor("o_out", sizes=("rows", "heads", "dim"), when="o_out.dim() == 3"),
        let("chunks", "o_out.shape[1]"),
        check("chunks >= 1 and heads % chunks == 0 and "
              "shape(o_out) == tup(rows, chunks, heads // chunks, dim)",
              "o_out: expected [rows, C, H/C, D] with C dividing H={heads} and rows={rows}, "
              "D={dim}, got shape {shape(o_out)}", when="o_out.dim() == 4"),
        tensor("lse_out", 2, "F32", ("rows", "heads"), optional=True),
        same_device("o_part", "lse_parts", "o_out", "lse_out"),
    ),
    returns=("parts", "rows", "heads", "dim"),
)

OPS: dict[str, OpSpec] = {s.name: s for s in (DECODE_VERIFY, WARMUP_DECODE_VERIFY,
                                                 CONTEXT_ATTENTION, MERGE_ATTN_STATES,
                                                 RESCALE_ATTN_PARTIAL)}


# --- schema parsing -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    type: str  # "Tensor", "Tensor?", "int", "int?", "float", "float?", "bool", "int[]"
    written: bool
    default: str | None


def parse_schema(schema: str) -> list[Arg]:
    inner = schema[schema.index("(") + 1: schema.rindex(") ->")]
    args = []
    for part in inner.split(", "):
        decl, _, default = part.partition("=")
        typ, name = decl.rsplit(" ", 1)
        written = "!" in typ
        typ = re.sub(r"\([a-z]!?\)", "", typ)
        args.append(Arg(name, typ, written, default or None))
    return args


# --- Python ---------------------------------------------------------------------------------

_TYPE_CHECKS = {
    # schema type -> (isinstance test, what the message says was expected); "T?" adds None
    "Tensor": ("isinstance({v}, _Tensor)", "a torch.Tensor"),
    "int": ("isinstance({v}, int) and not isinstance({v}, bool)", "an int"),
    "float": ("isinstance({v}, (int, float)) and not isinstance({v}, bool)", "a float"),
    "bool": ("isinstance({v}, bool)", "a bool"),
    "int[]": ("isinstance({v}, (list, tuple)) and all(isinstance(_e, int) and not "
              "isinstance(_e, bool) for _e in {v})", "a list of ints"),
}


def _type_check(typ: str) -> tuple[str, str]:
    test, what = _TYPE_CHECKS[typ.rstrip("?")]
    return (f"{{v}} is None or ({test})", f"{what} or None") if typ.endswith("?") else (test, what)


def python_source(op: OpSpec) -> str:
    """Source of ``check_<op>(...)``: the types the schema gives, then every rule in order."""
    args = parse_schema(op.schema)
    sig = ", ".join(a.name if a.default is None else f"{a.name}={a.default}" for a in args)
    lines = [f"def check_{op.name}({sig}):"]
    for a in args:
        test, what = _type_check(a.type)
        lines.append(f"    if not ({test.format(v=a.name)}):")
        lines.append(f"        raise TypeError(f\"{a.name}: expected {what}, got "
                     f"{{type({a.name}).__name__}}\")")
    for r in op.rules:
        fmsg = "f" + repr(r.msg)
        if r.kind == "let":
            lines.append(f"    {r.name} = {r.cond}")
            continue
        indent = "    "
        if r.when:
            lines.append(f"    if {r.when}:")
            indent = "        "
        if r.kind == "each":
            lines.append(f"{indent}for {r.name} in {r.over}:")
            indent += "    "
        lines.append(f"{indent}if not ({r.cond}):")
        lines.append(f"{indent}    raise {r.exc}({fmsg})")
    if op.returns:
        lines.append(f"    return ({', '.join(op.returns)},)")
    return "\n".join(lines) + "\n"


def _py_helpers() -> dict[str, Any]:
    import math

    import torch

    from .numerics import torch_dtypes

    sets = {k: torch_dtypes(k) for k in DTYPE_SETS}
    return {
        "_Tensor": torch.Tensor,
        "pow2": lambda n: n > 0 and (int(n) & (int(n) - 1)) == 0,
        "finite": math.isfinite,
        "shape": lambda t: tuple(t.shape),
        "lead": lambda t: tuple(t.shape[:-1]),
        "strides": lambda t: tuple(t.stride()),
        "dtype": str,
        "dtype_name": lambda d: str(d).replace("torch.", ""),
        "tup": lambda *xs: tuple(xs),
        "flt": float,
        **sets,
    }


_COMPILED: dict[str, Callable[..., Any]] = {}


def python_checks() -> dict[str, Callable[..., Any]]:
    """``{op name: check function}``, compiled from the spec once per process."""
    if not _COMPILED:
        ns = _py_helpers()
        for op in OPS.values():
            exec(compile(python_source(op), f"<mla_ops.spec:{op.name}>", "exec"), ns)
            _COMPILED[op.name] = ns[f"check_{op.name}"]
    return _COMPILED


# --- C++ ------------------------------------------------------------------------------------

_CPP_TYPE = {"Tensor": "at::Tensor", "int": "int64_t", "float": "double", "bool": "bool",
             "int[]": "at::IntArrayRef"}


def _cpp_param(typ: str, name: str) -> str:
    t = _CPP_TYPE[typ.rstrip("?")]
    t = f"std::optional<{t}>" if typ.endswith("?") else t
    return f"const {t}& {name}" if "Tensor" in t else f"{t} {name}"

_CPP_CALLS = {  # helper name -> C++ function (arguments translated)
    "pow2": "is_pow2", "finite": "std::isfinite", "shape": "sizes_of", "lead": "lead_sizes",
    "strides": "strides_of", "dtype": "dtype_str", "dtype_name": "dtype_name", "len": "list_len",
    "flt": "",
}


class _Cpp(ast.NodeVisitor):
    """Translates one expression of the rule language into C++."""

    def __init__(self, types: dict[str, str], lets: set[str]):
        self.types, self.lets = types, lets

    def __call__(self, expr: str) -> str:
        return self.visit(ast.parse(expr, mode="eval").body)

    def generic_visit(self, node):
        raise ValueError(f"mla_ops.spec: no C++ for {ast.dump(node)}")

    def visit_Name(self, node):
        n = node.id
        if n in DTYPE_SETS:
            return f"k{n}"
        if self.types.get(n, "").endswith("?"):
            return f"(*{n})"
        if n in self.types or n in self.lets:
            return n
        raise ValueError(f"mla_ops.spec: unknown name {n!r}")

    def visit_Constant(self, node):
        if isinstance(node.value, int) and not isinstance(node.value, bool):
            return f"int64_t({node.value})"
        raise ValueError(f"mla_ops.spec: constant {node.value!r}")

    def visit_UnaryOp(self, node):
        op = {ast.Not: "!", ast.USub: "-"}[type(node.op)]
        return f"({op}{self.visit(node.operand)})"

    def visit_IfExp(self, node):  # a if cond else b (both branches of one type)
        return f"({self.visit(node.test)} ? {self.visit(node.body)} : {self.visit(node.orelse)})"

    def visit_BoolOp(self, node):
        op = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + op.join(self.visit(v) for v in node.values) + ")"

    def visit_BinOp(self, node):
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}[
            type(node.op)]
        return f"({self.visit(node.left)} {op} {self.visit(node.right)})"

    def visit_Compare(self, node):
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            parts.append(self._compare(left, op, right))
            left = right
        return "(" + " && ".join(parts) + ")"

    def _compare(self, left, op, right):
        if isinstance(op, (ast.Is, ast.IsNot)):
            assert isinstance(right, ast.Constant) and right.value is None
            optional = self.types.get(left.id, "").endswith("?")
            has = f"{left.id}.has_value()" if optional else "true"
            return f"!{has}" if isinstance(op, ast.Is) else has
        if isinstance(op, ast.In):
            lhs = self.visit(left)
            if isinstance(right, ast.Tuple):
                return "(" + " || ".join(f"{lhs} == {self.visit(e)}" for e in right.elts) + ")"
            return f"contains({self.visit(right)}, {lhs})"
        sym = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
               ast.GtE: ">="}[type(op)]
        return f"({self.visit(left)} {sym} {self.visit(right)})"

    def visit_Attribute(self, node):
        base = self.visit(node.value)
        if node.attr == "dtype":
            return f"{base}.scalar_type()"
        if node.attr == "device":
            return f"{base}.device()"
        raise ValueError(f"mla_ops.spec: attribute {node.attr!r}")

    def visit_Subscript(self, node):  # x.shape[i]
        assert isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
        return f"{self.visit(node.value.value)}.sym_size({self.visit(node.slice)})"

    def visit_Call(self, node):
        args = [self.visit(a) for a in node.args]
        if isinstance(node.func, ast.Attribute):  # x.dim(), x.stride(i), x.numel()
            base = self.visit(node.func.value)
            meth = {"dim": "dim", "stride": "sym_stride", "numel": "sym_numel"}[node.func.attr]
            return f"{base}.{meth}({', '.join(args)})"
        name = node.func.id
        if name == "tup":
            return "std::vector<c10::SymInt>{" + ", ".join(f"c10::SymInt({a})" for a in args) + "}"
        return f"{_CPP_CALLS[name]}({', '.join(args)})"


def _cpp_message(msg: str, tr: _Cpp) -> str:
    parts = []
    for literal, field, _, _ in string.Formatter().parse(msg):
        if literal:
            parts.append('"' + literal.replace("\\", "\\\\").replace('"', '\\"') + '"')
        if field is not None:
            parts.append(tr(field))
    return ", ".join(parts)


def cpp_function(op: OpSpec) -> str:
    args = parse_schema(op.schema)
    types = {a.name: a.type for a in args}
    params = ",\n    ".join(_cpp_param(a.type, a.name) for a in args)
    lines = [f"void {op.name}_meta(\n    {params}) {{"]
    lines += [f"  (void){a.name};" for a in args]
    lets: set[str] = set()
    for r in op.rules:
        tr = _Cpp(types, lets)
        if r.kind == "let":
            lines.append(f"  const auto {r.name} = {tr(r.cond)};")
            lets.add(r.name)
            continue
        indent = "  "
        close = []
        if r.when:
            lines.append(f"  if ({tr(r.when)}) {{")
            indent, close = "    ", ["  }"]
        if r.kind == "each":
            lines.append(f"{indent}for (const int64_t {r.name} : {r.over}) {{")
            tr = _Cpp(types, lets | {r.name})
            close.insert(0, f"{indent}}}")
            indent += "  "
        macro = "MLA_CHECK_TYPE" if r.exc == "TypeError" else "MLA_CHECK_VALUE"
        lines.append(f"{indent}{macro}({tr(r.cond)}, {_cpp_message(r.msg, tr)});")
        lines += close
    lines.append("}")
    return "\n".join(lines)


def cpp_source() -> str:
    """The generated half of ``mla_ops._C``: dtype sets, schemas and one Meta kernel per op.
    ``csrc_meta/mla_meta.cpp`` includes it (``setup.py`` writes it into the build tree)."""
    out = ["// Generated from mla_ops/spec.py by setup.py. Do not edit.", ""]
    for name, dtypes in DTYPE_SETS.items():
        items = ", ".join(f"at::ScalarType::{_CPP_DTYPE.get(d, d.capitalize())}" for d in dtypes)
        out.append(f"const std::initializer_list<at::ScalarType> k{name} = {{{items}}};")
    out.append("")
    out.append("constexpr OpDef kOpDefs[] = {")
    for op in OPS.values():
        written = "true" if op.mutates else "false"
        out.append(f'  {{"{op.name}", "{op.name}{op.schema}", {written}}},')
    out.append("};")
    for op in OPS.values():
        out += ["", cpp_function(op)]
    out += ["", "void impl_meta(torch::Library& m) {"]
    out += [f'  m.impl("{op.name}", &{op.name}_meta);' for op in OPS.values()]
    out.append("}")
    return "\n".join(out) + "\n"


# at::ScalarType of a torch dtype name; the fp8 ones are the name capitalized.
_CPP_DTYPE = {"float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "int32": "Int",
              "int64": "Long"}


if __name__ == "__main__":  # python -m mla_ops.spec [--cpp | --python]: print the generated code
    import sys

    if "--cpp" in sys.argv:
        print(cpp_source(), end="")
    else:
        print("\n".join(python_source(op) for op in OPS.values()), end="")
