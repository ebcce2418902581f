"""Checked mode: metadata only the data can show wrong ends in a ValueError naming the argument,
the request and the value — on the function (the Triton kernels, under the interpreter here),
on the op's CPU kernel (the reference, which always validates) and on the GPU; a randomized
fuzz against a Python oracle of validity; the capture refusal; what the GPU does without it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import mla_ops
from mla_ops import checked
from mla_ops.merge import launch as merge

from builders import assert_within, decode_case, encoder_case, interpret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the cases of the issue ------------------------------------------------------------------

def _bad_decode(device, change):
    case = decode_case(device, batch=3, heads=2, qlen=2, lens=(5, 40, 70), page=16, Lv=32,
                       rope=16, dtype=torch.float16, real=(5, 40, 60), spare_pages=1)
    args = case.op_args(num_kv_splits=2)
    change(args, case)
    return case, args


def _num_pages(case):
    return case.k_buffer.shape[0] if case.k_buffer.dim() == 4 else \
        case.k_buffer.shape[0] // case.page_size


DECODE_BAD = [
    ("page-past-cache", "req_to_token: request 1 maps its page 2 to cache page",
     lambda a, c: a["req_to_token"].__setitem__((1, 2), _num_pages(c))),
    ("page-negative", "req_to_token: request 2 maps its page 0 to cache page -1",
     lambda a, c: a["req_to_token"].__setitem__((2, 0), -1)),
    ("len-past-table", "seq_lens: request 2 has length 81, more than its block table holds",
     lambda a, c: a["seq_lens"].__setitem__(2, a["req_to_token"].shape[1] * c.page_size + 1)),
    ("len-negative", "seq_lens: request 0 has length -3",
     lambda a, c: a["seq_lens"].__setitem__(0, -3)),
    ("real-past-len", "real_seq_lens: request 1 has real length 41 with seq_lens 40",
     lambda a, c: a["real_seq_lens"].__setitem__(1, 41)),
    ("repaged-3d-cache", "req_to_token: request",
     lambda a, c: a.update(k_buffer=c.k_buffer.reshape(-1, 1, c.k_buffer.shape[-1]),
                           v_buffer=c.k_buffer.reshape(-1, 1, c.k_buffer.shape[-1])[..., :32],
                           page_size=c.page_size * 4)),
]


def _raises_named(message):
    """pytest.raises(ValueError) for a message that starts with ``message`` (taken literally)."""
    import re

    return pytest.raises(ValueError, match="^" + re.escape(message))


def _on_reference_kernel(op, args):
    """The op's CPU kernel with the plain-PyTorch reference (not the interpreter)."""
    with interpret(False):
        op(**args)


@pytest.mark.parametrize("message,change", [c[1:] for c in DECODE_BAD],
                         ids=[c[0] for c in DECODE_BAD])
@pytest.mark.parametrize("path", ["function-checked", "op-reference"])
def test_bad_decode_metadata_named(device, path, message, change):
    if path == "op-reference" and device != "cpu":
        pytest.skip("the reference path is the CPU kernel")
    case, args = _bad_decode(device, change)
    o_before = args["o"].clone()
    with _raises_named(message):
        if path == "function-checked":
            with mla_ops.checked_mode():
                mla_ops.decode_attention_fwd_verify(**args)
        else:
            _on_reference_kernel(torch.ops.mla.decode_verify, args)
    assert torch.equal(args["o"].view(torch.uint8), o_before.view(torch.uint8))


def _bad_encoder(device, change):
    case = encoder_case(device, lens=(5, 9, 0, 3), hq=2, hkv=1, d=32, dtype=torch.float16)
    args = case.op_args()
    change(args)
    return args


ENCODER_BAD = [
    ("start-negative", "b_start_loc: sequence 1 has b_start_loc -1",
     lambda a: a["b_start_loc"].__setitem__(1, -1)),
    ("len-negative", "b_seq_len: sequence 3 has b_seq_len -2",
     lambda a: a["b_seq_len"].__setitem__(3, -2)),
    ("past-packed-tokens", "b_seq_len: sequence 3 covers tokens [14, 18), past the 17 packed",
     lambda a: a["b_seq_len"].__setitem__(3, 4)),
    ("overlap", "b_start_loc: sequence 1 starts at 3, inside sequence 0",
     lambda a: a["b_start_loc"].__setitem__(1, 3)),
    ("max-len-below", "max_input_len: 8 is below sequence 1's length 9",
     lambda a: a.update(max_input_len=8)),
]


@pytest.mark.parametrize("message,change", [c[1:] for c in ENCODER_BAD],
                         ids=[c[0] for c in ENCODER_BAD])
@pytest.mark.parametrize("path", ["function-checked", "op-reference"])
def test_bad_encoder_metadata_named(device, path, message, change):
    if path == "op-reference" and device != "cpu":
        pytest.skip("the reference path is the CPU kernel")
    args = _bad_encoder(device, change)
    o_before = args["o"].clone()
    with _raises_named(message):
        if path == "function-checked":
            with mla_ops.checked_mode():
                mla_ops.context_attention_fwd(**args)
        else:
            _on_reference_kernel(torch.ops.mla.context_attention, args)
    assert torch.equal(args["o"].view(torch.uint8), o_before.view(torch.uint8))


def _merge_lses(device):
    """Two partials' LSEs for 3 rows and 2 heads, with both empty markers (-inf, +inf)."""
    lse_parts = torch.randn(2, 3, 2, device=device)
    lse_parts[0, 1, 0], lse_parts[1, 0, 1] = float("-inf"), float("inf")
    return lse_parts


MERGE_OPS = {
    "merge": (merge.merge_attn_states, torch.ops.mla.merge_attn_states,
              lambda o_parts, lse_parts, o, lse: (o_parts, lse_parts, o, lse)),
    "rescale": (merge.rescale_attn_partial, torch.ops.mla.rescale_attn_partial,
                lambda o_parts, lse_parts, o, lse: (o_parts[1], lse_parts, 1, o, lse)),
}


@pytest.mark.parametrize("op", list(MERGE_OPS))
@pytest.mark.parametrize("path", ["function-checked", "op-reference"])
def test_nan_lse_named(device, path, op):
    """A NaN among the partials' LSEs (any partial's, also another's for the rescale) is refused
    with the partial, row and head; the ``±inf`` empty markers beside it are not."""
    if path == "op-reference" and device != "cpu":
        pytest.skip("the reference path is the CPU kernel")
    fn, the_op, arguments = MERGE_OPS[op]
    lse_parts = _merge_lses(device)
    lse_parts[0, 2, 1] = float("nan")
    o = torch.full((3, 2, 16), 7.0, device=device)
    args = arguments(torch.randn(2, 3, 2, 16, device=device), lse_parts, o,
                     torch.empty(3, 2, device=device))
    with _raises_named("lse_parts: partial 0 has LSE nan at row 2, head 1"):
        if path == "function-checked":
            with mla_ops.checked_mode():
                fn(*args)
        else:
            with interpret(False):
                the_op(*args)
    assert (o == 7.0).all(), "refused before any launch"


@pytest.mark.parametrize("op", list(MERGE_OPS))
def test_checked_mode_accepts_infinite_lse(device, op):
    """``-inf`` and ``+inf`` LSEs are empty partials, not errors: checked mode runs the merge."""
    fn, _, arguments = MERGE_OPS[op]
    o = torch.full((3, 2, 16), float("nan"), device=device)
    with mla_ops.checked_mode():
        fn(*arguments(torch.randn(2, 3, 2, 16, device=device), _merge_lses(device), o, None))
    assert not torch.isnan(o).any()


def test_checked_mode_switches(monkeypatch):
    was_on = checked.enabled()
    monkeypatch.delenv(checked.ENV, raising=False)  # monkeypatch puts the variable back after
    try:
        mla_ops.set_checked_mode(None)
        assert not checked.enabled()
        with mla_ops.checked_mode():
            assert checked.enabled()
            with mla_ops.checked_mode(False):
                assert not checked.enabled()
        monkeypatch.setenv(checked.ENV, "1")
        mla_ops.set_checked_mode(False)
        assert not checked.enabled()
        mla_ops.set_checked_mode(None)  # back to the environment
        assert checked.enabled()
    finally:
        mla_ops.set_checked_mode(was_on)  # the switch as it was, whatever the environment says


def test_checked_mode_valid_input_runs(device):
    """No valid input is refused: the kernel runs and matches the reference."""
    case = decode_case(device, batch=3, heads=2, qlen=2, lens=(1, 40, 70), page=16, Lv=32,
                       rope=16, dtype=torch.float16, real=(0, 40, 61))
    with mla_ops.checked_mode():
        o, lse = case.run(num_kv_splits=2)
    case.assert_matches(o, lse)


# --- checked mode off: out-of-range metadata is clamped and marked ---------------------------
#
# No fault, no silent garbage: the request with a bad page index or length gets NaN in every row
# of o and lse; every other request is right (the tolerance rule, on a case without the bad one).

def _marked_decode(device, dtype=torch.float16, qlen=2):
    """Three requests of 16 heads (two 16-row blocks each with BLOCK_H 16 at qlen 2), pages of
    16; request 1's last page holds only its last key, which only its last token's rows read."""
    return decode_case(device, batch=3, heads=16, qlen=qlen, lens=(5, 33, 70), page=16, Lv=32,
                       rope=16, dtype=dtype, spare_pages=1, poison_past_end=True)


def _set(name, index, value):
    def change(args, case):
        args[name][index] = value(args, case) if callable(value) else value
    return change


# (id, request made bad, change)
DECODE_OOB = [
    ("page-num-pages", 1, _set("req_to_token", (1, 1), lambda a, c: _num_pages(c))),
    ("page-2e20", 2, _set("req_to_token", (2, 3), 2 ** 20)),
    ("page-minus-1", 0, _set("req_to_token", (0, 0), -1)),
    # Only token 1's rows (the second row block) read it, and with 3 splits of 16 only its
    # third split: the other row block and stage 2 must still mark token 0's rows.
    ("page-last-key-only", 1, _set("req_to_token", (1, 2), lambda a, c: _num_pages(c) + 7)),
    # Past the block table of the last request: a read past the table's end without the clamp.
    ("len-past-table", 2, lambda a, c: (a["seq_lens"].__setitem__(2, 5 * c.page_size + 9))),
    ("len-negative", 0, _set("seq_lens", 0, -4)),
]

# (id, split cap, config): the pointer path with a page per token of the block, one page per
# block, the TMA descriptors, and several splits merged by stage 2 (MIN_SPLIT_LEN 16: request
# 1's 33 keys in 3 splits).
DECODE_OOB_PATHS = [
    ("tokenwise", 1, {"BLOCK_H": 16, "BLOCK_N": 32}),
    ("onepage", 1, {"BLOCK_H": 16, "BLOCK_N": 16}),
    ("tma", 1, {"BLOCK_H": 16, "BLOCK_N": 16, "TMA": 1}),
    ("splits3-onepage", 3, {"BLOCK_H": 16, "BLOCK_N": 16, "MIN_SPLIT_LEN": 16, "SPLIT_ALIGN": 16}),
    ("splits3-tokenwise", 3, {"BLOCK_H": 16, "BLOCK_N": 32, "MIN_SPLIT_LEN": 16,
                              "SPLIT_ALIGN": 16}),
]


def assert_decode_marked(case, o, lse, bad):
    """Request ``bad``: NaN in every row of o and lse; the others: the tolerance rule."""
    rows = case.rows([bad])
    assert o[rows].isnan().all() and lse[rows].isnan().all(), \
        f"request {bad} is not marked: {o[rows].isnan().float().mean():.2f} of o NaN, " \
        f"{lse[rows].isnan().float().mean():.2f} of lse"
    others = [b for b in range(case.batch) if b != bad]
    case.subset(others).assert_matches(o[case.rows(others)], lse[case.rows(others)])


@pytest.mark.parametrize("path", DECODE_OOB_PATHS, ids=[p[0] for p in DECODE_OOB_PATHS])
@pytest.mark.parametrize("bad,change", [c[1:] for c in DECODE_OOB], ids=[c[0] for c in DECODE_OOB])
def test_unchecked_decode_marks_out_of_range_metadata(device, bad, change, path):
    _, splits, config = path
    case = _marked_decode(device)
    args = case.op_args(num_kv_splits=splits)
    change(args, case)
    with mla_ops.checked_mode(False):
        mla_ops.decode_attention_fwd_verify(**args, config=config)
    assert_decode_marked(case, args["o"], args["lse"], bad)


def test_unchecked_decode_marks_a_page_past_the_first_extra_table_entries(device):
    """Pages of one token and 40 rows of one head: row block 0 (tokens 0-15) does not read the
    last 24 keys' table entries, which later rows do: more than the 16 stage 1 checks per step
    of its loop over them, so a bad entry among the last 8 is found only by the second step."""
    case = decode_case(device, batch=2, heads=1, qlen=40, lens=(50, 64), page=1, Lv=32, rope=16,
                       dtype=torch.float16, spare_pages=1, poison_past_end=True)
    args = case.op_args(num_kv_splits=1)
    args["req_to_token"][1, 61] = _num_pages(case) + 3  # key 61: tokens 37-39 see it
    with mla_ops.checked_mode(False):
        mla_ops.decode_attention_fwd_verify(**args, config={"BLOCK_H": 16, "BLOCK_N": 16})
    assert_decode_marked(case, args["o"], args["lse"], 1)


@pytest.mark.parametrize("path", DECODE_OOB_PATHS[3:], ids=[p[0] for p in DECODE_OOB_PATHS[3:]])
@pytest.mark.parametrize("bad,change", [c[1:] for c in DECODE_OOB], ids=[c[0] for c in DECODE_OOB])
def test_unchecked_decode_marks_out_of_range_metadata_qlen1(device, bad, change, path):
    """qlen 1, several splits: stage 1 compiles without the check of the table entries only
    later rows read (one row block per split reads every entry of it), and still marks."""
    _, splits, config = path
    case = _marked_decode(device, qlen=1)
    args = case.op_args(num_kv_splits=splits)
    change(args, case)
    with mla_ops.checked_mode(False):
        mla_ops.decode_attention_fwd_verify(**args, config=config)
    assert_decode_marked(case, args["o"], args["lse"], bad)


def test_unchecked_decode_real_len_below_a_bad_page_reads_and_marks_nothing(device):
    """A bad page only past a request's real length is never read: nothing is marked (the
    padded drafts of a captured batch may carry any table past their real length)."""
    case = decode_case(device, batch=2, heads=16, qlen=2, lens=(40, 70), page=16, Lv=32,
                       rope=16, dtype=torch.float32, real=(16, 70), spare_pages=1)
    args = case.op_args(num_kv_splits=2)
    args["req_to_token"][0, 1] = 2 ** 20  # keys 16..31 of request 0: past its real length 16
    with mla_ops.checked_mode(False):
        mla_ops.decode_attention_fwd_verify(**args, config={"MIN_SPLIT_LEN": 16, "SPLIT_ALIGN": 16})
    args["req_to_token"][0, 1] = 0  # the reference reads no key there either
    case.assert_matches(args["o"], args["lse"])


def test_unchecked_decode_empty_cache_marks_every_request_with_keys(device):
    """A cache of no pages: nothing can be read, so every request with a key is marked and
    one without (length 0) is not."""
    case = decode_case(device, batch=2, heads=16, qlen=1, lens=(0, 9), page=4, Lv=32, rope=16,
                       dtype=torch.float32, spare_pages=0)
    args = case.op_args()
    args["k_buffer"] = case.k_buffer[:0]
    args["v_buffer"] = args["k_buffer"][..., :32]
    with mla_ops.checked_mode(False):
        mla_ops.decode_attention_fwd_verify(**args)
    assert args["o"][1].isnan().all() and args["lse"][1].isnan().all()
    assert (args["o"][0] == 0).all() and torch.isinf(args["lse"][0]).all()


def _marked_encoder(device, causal=True):
    """Sequences of 5, 37, 0 and 3 tokens packed in 45 tokens; head dim 40 (a 32 + 16 split, so
    the tail lanes are covered too)."""
    return encoder_case(device, lens=(5, 37, 0, 3), hq=2, hkv=1, d=40, dtype=torch.float16,
                        causal=causal)


# (id, sequence made bad, its rows inside the packed tokens, change)
ENCODER_OOB = [
    ("start-negative", 0, range(0, 3), ("b_start_loc", 0, -2)),
    ("end-past-total", 3, range(42, 45), ("b_seq_len", 3, 4)),
    ("start-past-total", 3, range(0), ("b_start_loc", 3, 46)),
    ("start-far-past-total", 1, range(0), ("b_start_loc", 1, 2 ** 30)),
    ("len-negative", 1, range(0), ("b_seq_len", 1, -3)),
]

# BLOCK_M 16: sequence 1 spans three row blocks.
ENCODER_CONFIGS = {"default": None, "bm16": {"BLOCK_M": 16, "BLOCK_N": 16}}


@pytest.mark.parametrize("config", sorted(ENCODER_CONFIGS))
@pytest.mark.parametrize("bad,rows,change", [c[1:] for c in ENCODER_OOB], ids=[c[0] for c in ENCODER_OOB])
def test_unchecked_encoder_marks_out_of_range_metadata(device, bad, rows, change, config):
    """The bad sequence's rows inside the packed tokens are NaN, no row outside it is written
    (a sentinel, not NaN, so that a NaN write shows), the other sequences are right."""
    case = _marked_encoder(device)
    args = case.op_args()
    args["o"].fill_(7.0)
    name, index, value = change
    args[name] = args[name].clone()
    args[name][index] = value
    with mla_ops.checked_mode(False):
        mla_ops.context_attention_fwd(**args, config=ENCODER_CONFIGS[config])
    o = args["o"]
    others = [i for i in range(4) if i != bad]
    mine = torch.zeros(o.shape[0], dtype=torch.bool, device=o.device)
    mine[list(rows)] = True
    assert o[mine].isnan().all(), f"sequence {bad} is not marked"
    sub = case.subset(others)
    outside = ~(mine | sub.inside())
    assert (o[outside] == 7.0).all(), "a row outside every sequence was written"
    sub.assert_matches(o, outside_untouched=False)


@pytest.mark.parametrize("config", sorted(ENCODER_CONFIGS))
@pytest.mark.parametrize("max_len", [4, 0])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_unchecked_encoder_marks_rows_past_max_input_len(device, max_len, causal, config):
    """``max_input_len`` below some lengths: their rows from ``max_input_len`` on are NaN (those
    past the grid's last row block included: BLOCK_M 16 leaves 21 of sequence 1's 37 rows
    outside a one-block grid), the rows below it are right, shorter sequences untouched."""
    case = _marked_encoder(device, causal=causal)
    args = case.op_args(max_input_len=max_len)
    args["o"].fill_(7.0)  # not NaN: a row left unwritten must show
    with mla_ops.checked_mode(False):
        mla_ops.context_attention_fwd(**args, config=ENCODER_CONFIGS[config])
    o = args["o"]
    starts, lens = case.b_start_loc.tolist(), case.b_seq_len.tolist()
    past = torch.zeros(o.shape[0], dtype=torch.bool, device=o.device)
    for s, n in zip(starts, lens):
        past[s + min(n, max_len):s + n] = True
    assert o[past].isnan().all(), "rows past max_input_len are not all NaN"
    inside = case.inside() & ~past
    assert not o[inside].isnan().any()
    assert (o[~case.inside()] == 7.0).all(), "a row outside every sequence was written"
    ref, low = case.reference(torch.float64), case.lowp_reference()
    groups = [(f"sequence {i} below max_input_len", slice(s, s + min(n, max_len)))
              for i, (s, n) in enumerate(zip(starts, lens)) if min(n, max_len)]
    assert_within("o", o, ref, low, groups, case.q.dtype)


GUARDED = textwrap.dedent(r"""
    # Each case's tensors sit flush against unmapped pages: a read or write outside them kills
    # this process (SIGSEGV) instead of touching a neighbour's bytes; "case <id>" names the one.
    import json, sys, dataclasses, torch
    sys.path.insert(0, "tests")
    import mla_ops
    from builders import decode_case, encoder_case, guarded

    def report(name, ok):
        print(json.dumps({"case": name, "marked": bool(ok)}), flush=True)

    def decode(name, change, guard, config, splits=1):
        print("case", name, flush=True)
        c = decode_case("cpu", batch=3, heads=4, qlen=2, lens=(5, 33, 70), page=16, Lv=32,
                        rope=16, dtype=torch.float32, spare_pages=0)
        c = dataclasses.replace(c, **{guard: guarded(getattr(c, guard))})
        c = dataclasses.replace(c, v_buffer=c.k_buffer[..., :32])
        args = c.op_args(splits)
        bad = change(args, c)
        mla_ops.decode_attention_fwd_verify(**args, config=config)
        rows = c.rows([bad])
        report(name, args["o"][rows].isnan().all() and args["lse"][rows].isnan().all())

    def encoder(name, index, start, length, side):
        print("case", name, flush=True)
        c = encoder_case("cpu", lens=(5, 37, 0, 3), hq=2, hkv=1, d=40, dtype=torch.float16)
        q, k, v = (guarded(t, side) for t in (c.q, c.k, c.v))
        o = guarded(torch.full_like(c.q, 7.0), side)
        starts, lens = c.b_start_loc.clone(), c.b_seq_len.clone()
        starts[index], lens[index] = start, length
        mla_ops.context_attention_fwd(q, k, v, o, starts, lens, 37,
                                      config={"BLOCK_M": 16, "BLOCK_N": 16})
        lo, hi = max(start, 0), min(start + length, q.shape[0])
        report(name, o[lo:hi].isnan().all())  # (an empty range when it lies past the tokens)

    def table_past_cache(args, c):
        args["req_to_token"][2, 4] = c.k_buffer.shape[0]  # the page right after the cache
        return 2

    def len_past_table(args, c):
        args["seq_lens"][2] = 5 * 16 + 9  # table entry 5 of the last row: past the table's end
        return 2

    for cfg_name, cfg in (("tokenwise", {"BLOCK_H": 16, "BLOCK_N": 32}),
                          ("onepage", {"BLOCK_H": 16, "BLOCK_N": 16})):
        for splits in (1, 3):
            extra = {"MIN_SPLIT_LEN": 16, "SPLIT_ALIGN": 16} if splits > 1 else {}
            decode(f"decode-page-past-cache-{cfg_name}-s{splits}", table_past_cache, "k_buffer",
                   {**cfg, **extra}, splits)
            decode(f"decode-len-past-table-{cfg_name}-s{splits}", len_past_table, "req_to_token",
                   {**cfg, **extra}, splits)
    encoder("encoder-end-past-total", 3, 42, 4, "end")
    encoder("encoder-start-far-past-total", 1, 2 ** 30, 37, "end")
    encoder("encoder-start-negative", 0, -2, 5, "start")
    print("all cases done", flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guarded pages need Linux mmap")
def test_unchecked_out_of_range_metadata_never_touches_memory_outside(device):
    """The clamps themselves (the marks are tested above): every tensor of each case lies flush
    against an unmapped page, so one read or write outside q / k / v / o, the cache or the
    block table kills the child process. Each case completes and marks its request."""
    if device != "cpu":
        pytest.skip("guarded host pages: the interpreter's loads are host reads")
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_INTERPRET": "1", checked.ENV: "0"}
    proc = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    lines = proc.stdout.splitlines()
    started = [line[5:] for line in lines if line.startswith("case ")]
    assert proc.returncode == 0, (f"exit {proc.returncode} in case {started[-1] if started else '?'}"
                                  f" (-11: a read outside a tensor)\n{proc.stderr[-2000:]}")
    import json

    results = [json.loads(line) for line in lines if line.startswith("{")]
    assert lines[-1:] == ["all cases done"] and len(results) == len(started), proc.stdout
    assert all(r["marked"] for r in results), [r for r in results if not r["marked"]]


# --- fuzz: checked-mode verdicts against a Python oracle -------------------------------------

def _decode_oracle(lens, real, table, num_pages, page, world, rank, interleave):
    """Which arguments are wrong, by plain loops (empty: valid)."""
    bad = set()
    cap = len(table[0]) * page
    for b, L in enumerate(lens):
        if L < 0:
            bad.add("seq_lens")
            continue
        if real is not None and not 0 <= real[b] <= L:
            bad.add("real_seq_lens")
        local = sum(1 for pos in range(L) if (pos // interleave) % world == rank)
        if local > cap:
            bad.add("seq_lens")
            continue
        for j in range(-(-local // page)):
            if not 0 <= table[b][j] < num_pages:
                bad.add("req_to_token")
    return bad


def _encoder_oracle(starts, lens, total, max_len):
    bad = set()
    if any(s < 0 for s in starts):
        bad.add("b_start_loc")
    if any(n < 0 for n in lens):
        bad.add("b_seq_len")
    if bad:
        return bad
    if any(s + n > total for s, n in zip(starts, lens)):
        bad.add("b_seq_len")
    if lens and max(lens) > max_len:
        bad.add("max_input_len")
    live = sorted((s, s + n) for s, n in zip(starts, lens) if n > 0)
    if any(b0 < a1 for (a0, a1), (b0, b1) in zip(live, live[1:])):
        bad.add("b_start_loc")
    return bad


def _verdict(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
        return None
    except ValueError as e:
        return str(e).split(":")[0]


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_decode_metadata_against_oracle(seed):
    rng = random.Random(seed)
    seen = {"valid": 0, "invalid": 0}
    for _ in range(150):
        batch, page = rng.randint(1, 4), rng.choice([1, 4, 16])
        pages_per, num_pages = rng.randint(1, 4), rng.randint(1, 12)
        world = rng.choice([1, 1, 2, 3])
        rank, interleave = rng.randrange(world), rng.choice([1, 2, 16])
        valid_table = rng.random() < 0.7
        table = [[rng.randrange(num_pages) if valid_table or rng.random() < 0.8
                  else rng.choice([-1, num_pages, num_pages + 5]) for _ in range(pages_per)]
                 for _ in range(batch)]
        cap = pages_per * page * world
        lens = [rng.randint(-1 if rng.random() < 0.05 else 0, cap + 2) for _ in range(batch)]
        real = None if rng.random() < 0.4 else [
            min(L, rng.randint(0, max(0, L))) + (1 if rng.random() < 0.05 else 0) for L in lens]
        cache = torch.empty(num_pages, page, 1, 48)
        i32 = dict(dtype=torch.int32)
        args = dict(q=torch.empty(batch * 2, 2, 48), k_buffer=cache, v_buffer=cache[..., :32],
                    o=torch.empty(batch * 2, 2, 32), lse=torch.empty(batch * 2, 2),
                    req_to_token=torch.tensor(table, **i32), seq_lens=torch.tensor(lens, **i32),
                    real_seq_lens=None if real is None else torch.tensor(real, **i32), qlen=2,
                    attn_logits=None, num_kv_splits=1, sm_scale=0.5, page_size=page,
                    k_scale=None, cp_world=world, cp_rank=rank, cp_interleave=interleave)
        want = _decode_oracle(lens, real, table, num_pages, page, world, rank, interleave)
        got = _verdict(checked.validate_decode_verify, **args)
        assert (got is None) == (not want), (args, want, got)
        assert got is None or got in want, (args, want, got)
        seen["invalid" if want else "valid"] += 1
    assert min(seen.values()) > 20, seen  # the generator exercises both sides


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_encoder_metadata_against_oracle(seed):
    rng = random.Random(100 + seed)
    seen = {"valid": 0, "invalid": 0}
    for _ in range(200):
        n = rng.randint(1, 5)
        lens = [rng.choice([0, rng.randint(1, 9)]) for _ in range(n)]
        starts, pos = [], 0
        for length in lens:  # packed in order, then perturbed
            starts.append(pos)
            pos += length + rng.choice([0, 0, 1])
        total = pos + rng.choice([0, 0, -1, 2])
        if rng.random() < 0.3:
            i = rng.randrange(n)
            starts[i] += rng.choice([-2, -1, 1, 3])
        if rng.random() < 0.1:
            lens[rng.randrange(n)] = -1
        max_len = max(lens + [0]) + rng.choice([0, 0, 0, -1, 2])
        if max_len < 0 or total < 1:
            continue
        x = torch.empty(total, 2, 16)
        args = (x, x, x, x, torch.tensor(starts, dtype=torch.int32),
                torch.tensor(lens, dtype=torch.int32), max_len)
        want = _encoder_oracle(starts, lens, total, max_len)
        got = _verdict(checked.validate_context_attention, *args)
        assert (got is None) == (not want), (starts, lens, total, max_len, want, got)
        assert got is None or got in want, (starts, lens, total, max_len, want, got)
        seen["invalid" if want else "valid"] += 1
    assert min(seen.values()) > 20, seen


# --- GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_checked_mode_refuses_capture(device):
    case = decode_case(device, batch=2, heads=16, qlen=2, lens=(100, 300), page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16)
    args = case.op_args(num_kv_splits=1)
    mla_ops.decode_attention_fwd_verify(**args)  # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with mla_ops.checked_mode(), pytest.raises(RuntimeError, match="CUDA graph capture"):
        with torch.cuda.graph(g):
            mla_ops.decode_attention_fwd_verify(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["function", "op"])
def test_gpu_checked_mode_names_a_page_past_the_cache(device, path):
    case = decode_case(device, batch=2, heads=16, qlen=2, lens=(100, 300), page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16)
    args = case.op_args(num_kv_splits=2)
    args["req_to_token"][1, 3] = 10 ** 6
    fn = mla_ops.decode_attention_fwd_verify if path == "function" else torch.ops.mla.decode_verify
    with mla_ops.checked_mode(), pytest.raises(ValueError, match="^req_to_token: request 1 maps "
                                               "its page 3 to cache page 1000000"):
        fn(**args)


GPU_OOB = textwrap.dedent(r"""
    # One family's launches with out-of-range metadata, on the GPU, in a child process (an
    # illegal address would poison the CUDA context). One JSON line per case:
    # completed (no error), marked (the bad request's / sequence's rows NaN), others (the rest
    # right by the tolerance rule, nothing outside the sequences written).
    import json, sys, traceback, torch
    sys.path.insert(0, "tests")
    import mla_ops
    from builders import decode_case, encoder_case

    kind, family = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}  # more config keys (decode)

    def run(name, call, check):
        out = {"case": name}
        try:
            call()
            torch.cuda.synchronize()
            out["completed"] = True
            out["marked"], out["others"] = check()
        except Exception as e:
            out["completed"] = False
            out["error"] = traceback.format_exception_only(e)[-1][:300]
        print(json.dumps(out), flush=True)
        if not out["completed"] and "illegal" in out.get("error", ""):
            sys.exit(3)  # the context is gone

    def others_right(fn):
        try:
            fn()
            return True
        except AssertionError as e:
            return str(e)[:300]

    if kind == "decode":
        page = int(sys.argv[3])
        # Request 1's last page holds only its last key (3072 is a multiple of every page size).
        case = decode_case("cuda", batch=3, heads=16, qlen=2, lens=(100, 3073, 700), page=page,
                           Lv=512, rope=64, dtype=torch.bfloat16, poison_past_end=True)
        num_pages = case.k_buffer.shape[0]
        cap = case.req_to_token.shape[1] * page
        mid = 1500 // page
        changes = [
            ("page-num-pages", 1, lambda a: a["req_to_token"].__setitem__((1, mid), num_pages)),
            ("page-2e20", 1, lambda a: a["req_to_token"].__setitem__((1, mid), 2 ** 20)),
            ("page-2e28", 1, lambda a: a["req_to_token"].__setitem__((1, mid), 2 ** 28)),
            ("page-minus-1", 1, lambda a: a["req_to_token"].__setitem__((1, mid), -1)),
            ("page-last-key-only", 1, lambda a: a["req_to_token"].__setitem__((1, 3072 // page), 2 ** 28)),
            ("len-past-table", 2, lambda a: a["seq_lens"].__setitem__(2, cap + 5)),
            ("len-negative", 0, lambda a: a["seq_lens"].__setitem__(0, -7)),
        ]
        table, lens = case.req_to_token.clone(), case.seq_lens.clone()
        for name, bad, change in changes:
            for splits in (1, 4):
                case.req_to_token.copy_(table)  # (op_args hands out the case's own tensors)
                case.seq_lens.copy_(lens)
                args = case.op_args(splits)
                change(args)
                def call(args=args):
                    mla_ops.decode_attention_fwd_verify(**args, config={"family": family, **extra})
                def check(args=args, bad=bad):
                    rows = case.rows([bad])
                    marked = bool(args["o"][rows].isnan().all() and args["lse"][rows].isnan().all())
                    rest = [b for b in range(3) if b != bad]
                    return marked, others_right(lambda: case.subset(rest).assert_matches(
                        args["o"][case.rows(rest)], args["lse"][case.rows(rest)]))
                run(f"{name}-splits{splits}", call, check)
    else:
        case = encoder_case("cuda", lens=(300, 1000, 0, 200), hq=4, hkv=2, d=72,
                            dtype=torch.bfloat16)
        total = case.q.shape[0]
        changes = [  # (id, sequence, start, length, max_input_len)
            ("start-negative", 0, -50, 300, 1000), ("end-past-total", 3, 1300, 260, 1000),
            ("start-far-past-total", 1, 2 ** 30, 1000, 1000), ("len-negative", 1, 300, -5, 1000),
            ("max-input-len-100", None, None, None, 100), ("max-input-len-0", None, None, None, 0),
        ]
        for name, seq, start, length, max_len in changes:
            args = case.op_args(max_input_len=max_len)
            args["o"].fill_(7.0)
            args["b_start_loc"], args["b_seq_len"] = args["b_start_loc"].clone(), args["b_seq_len"].clone()
            if seq is not None:
                args["b_start_loc"][seq], args["b_seq_len"][seq] = start, length
            def call(args=args):
                mla_ops.context_attention_fwd(**args, config={"family": family})
            def check(args=args, seq=seq, start=start, length=length, max_len=max_len):
                o = args["o"]
                nan_rows = torch.zeros(total, dtype=torch.bool, device=o.device)
                if seq is not None:
                    nan_rows[max(start, 0):max(min(start + length, total), 0)] = True
                    rest = [i for i in range(4) if i != seq]
                else:
                    for s, n in zip(case.b_start_loc.tolist(), case.b_seq_len.tolist()):
                        nan_rows[s + min(n, max_len):s + n] = True
                    rest = [i for i, n in enumerate(case.b_seq_len.tolist()) if n <= max_len]
                marked = bool(o[nan_rows].isnan().all())
                sub = case.subset(rest)
                untouched = ~(nan_rows | sub.inside())
                if seq is None:
                    untouched &= ~case.inside()
                def rest_right():
                    assert (o[untouched] == 7.0).all(), "a row outside the sequences was written"
                    sub.assert_matches(o, outside_untouched=False)
                return marked, others_right(rest_right)
            run(name, call, check)
""")


def _gpu_oob(*argv):
    """Run GPU_OOB in a child process; returns its JSON lines (asserting it did not die)."""
    import json

    env = {**os.environ, "PYTHONPATH": ROOT, checked.ENV: "0"}
    proc = subprocess.run([sys.executable, "-c", GPU_OOB, *map(str, argv)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        print(line)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    assert lines
    return lines


def _assert_all_marked(lines):
    bad = [r for r in lines if not (r["completed"] and r["marked"] and r["others"] is True)]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("family,page,extra", [("triton", 1, {}), ("triton", 16, {}), ("triton", 64, {}),
                                               ("gluon", 64, {}),
                                               ("gluon", 64, {"SCHEDULE": "swapab", "LEAN_SOFTMAX": 1, "GRID": 1})],
                         ids=["triton-p1", "triton-p16", "triton-p64", "gluon-p64", "gluon-grid-p64"])
def test_gpu_out_of_range_page_without_checked_mode(family, page, extra):
    """What the GPU does with out-of-range metadata when nobody checks (the README's bad-input
    section): never a fault, never silent. Pages num_pages, 2^20, 2^28 and -1 (mid-request and
    read by the last token only), a length past the block table, a negative length, with one
    split and four: the call completes, the bad request's rows are NaN in o and lse, the
    others are right. (bf16; the Gluon family needs pages of 64; "grid": with four splits on the
    balanced grid, whose CTAs read every request's length to lay out the batch.)"""
    import json

    _assert_all_marked(_gpu_oob("decode", family, page, json.dumps(extra)))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["triton", "gluon"])
def test_gpu_encoder_out_of_range_metadata_without_checked_mode(family):
    """The encoder's counterpart: a negative start, an end past the packed tokens, a start far
    past them, a negative length, max_input_len 100 and 0 (head dim 72, bf16): no fault, the
    sequence's rows inside the tokens (or its rows from max_input_len on) NaN, the rest right
    and nothing outside the sequences written."""
    _assert_all_marked(_gpu_oob("encoder", family))
