"""Which launch each architecture picks for the encoder kernel, asserted on any machine.

``build_launch`` returns the launch ``context_attention_fwd`` would make without running it,
and ``mock_platform(arch, interpret=False)`` pretends to be each GPU (so the compiler
workarounds of its backend apply, as they would there): the sm_90 (H200 sweep,
``prefill/tables/sm_90.json``), gfx1151 (seed 001) and generic tables are pinned here as expect
tables. A retune is a data change; regenerate with
``EXPECTTEST_ACCEPT=1 pytest tests/test_context_attention_configs.py``.
"""

from __future__ import annotations

import expecttest
import pytest
import torch

import mla_ops  # noqa: F401
from mla_ops import tuning
from mla_ops.platform import mock_platform
from mla_ops.prefill import launch as L

HEAD_DIMS = [64, 72, 80, 88, 96, 112, 128, 256]


def _meta_args(head_dim, head_stride=None, causal=False, dtype=torch.bfloat16):
    """Meta tensors for one B=1 S=3520 H=16 launch; ``head_stride`` pads the head axis."""
    hs = head_stride or head_dim
    buf = torch.empty(3520, 16, hs, dtype=dtype, device="meta")
    t = buf[:, :, :head_dim]
    idx = torch.zeros(1, dtype=torch.int32, device="meta")
    return (t, t, t, t, idx, idx, 3520, causal)


def _launch(arch, head_dim, head_stride=None, causal=False, config=None, interpret=False,
            dtype=torch.bfloat16):
    with mock_platform(arch, interpret=interpret):
        return L.build_launch(*_meta_args(head_dim, head_stride, causal, dtype), config=config)


def _row(arch, head_dim, head_stride=None, causal=False, **kw):
    launch = _launch(arch, head_dim, head_stride, causal, **kw)
    c = launch.config
    split = f"{c['BLOCK_D']}+{c['BLOCK_D_TAIL']}"
    hint = "hint" if c["HEAD_STRIDE_ALIGNED_8"] else "nohint"
    extra = " tma" if c["USE_TMA"] else ""
    extra += " copied" if launch.copied else ""
    extra += f" wpe={c['waves_per_eu']}" if "waves_per_eu" in c else ""
    extra += " reversed" if launch.kwargs["NUM_M_BLOCKS_REVERSED"] else ""
    stride = f"/s{head_stride}" if head_stride else ""
    mode = " causal" if causal else ""
    return (f"D{head_dim}{stride}{mode}: {split} {hint} BM={c['BLOCK_M']} BN={c['BLOCK_N']} "
            f"nw={c['num_warps']} ns={c['num_stages']}{extra} grid={launch.grid}")


def _table(arch):
    rows = [_row(arch, d) for d in HEAD_DIMS]
    rows.append(_row(arch, 72, head_stride=76))  # padded: 76 % 8 != 0, no hint
    rows.append(_row(arch, 72, head_stride=80))  # padded but 8-aligned: hint on
    # Causal: the same tiles (no table keys on it yet), the M blocks launched longest first.
    rows += [_row(arch, d, causal=True) for d in (64, 72, 256)]
    return "\n".join(rows)


class TestLaunchTables(expecttest.TestCase):
    def test_split(self):
        got = "\n".join(f"{d}: {L.head_dim_split(d)}" for d in [16, 40, 64, 72, 80, 88, 96, 112, 128, 144, 160, 192, 256])
        self.assertExpectedInline(got, """\
16: (16, 0)
40: (32, 16)
64: (64, 0)
72: (64, 16)
80: (64, 16)
88: (64, 32)
96: (64, 32)
112: (128, 0)
128: (128, 0)
144: (128, 16)
160: (128, 32)
192: (128, 64)
256: (256, 0)""")

    def test_gfx1151(self):
        self.assertExpectedInline(_table("gfx1151"), """\
D64: 64+0 hint BM=128 BN=32 nw=4 ns=1 grid=(28, 16, 1)
D72: 64+16 hint BM=128 BN=16 nw=4 ns=1 grid=(28, 16, 1)
D80: 64+16 hint BM=128 BN=16 nw=4 ns=1 grid=(28, 16, 1)
D88: 64+32 hint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D96: 64+32 hint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D112: 128+0 hint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D128: 128+0 hint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D256: 256+0 hint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D72/s76: 64+16 nohint BM=128 BN=32 nw=8 ns=1 grid=(28, 16, 1)
D72/s80: 64+16 hint BM=128 BN=16 nw=4 ns=1 grid=(28, 16, 1)
D64 causal: 64+0 hint BM=128 BN=32 nw=4 ns=1 reversed grid=(28, 16, 1)
D72 causal: 64+16 hint BM=128 BN=16 nw=4 ns=1 reversed grid=(28, 16, 1)
D256 causal: 256+0 hint BM=128 BN=32 nw=8 ns=1 reversed grid=(28, 16, 1)""")

    def test_sm_90(self):
        self.assertExpectedInline(_table("sm_90"), """\
D64: 64+0 hint BM=128 BN=64 nw=8 ns=3 grid=(28, 16, 1)
D72: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)
D80: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)
D88: 64+32 hint BM=128 BN=64 nw=4 ns=3 tma grid=(28, 16, 1)
D96: 64+32 hint BM=128 BN=64 nw=4 ns=3 tma grid=(28, 16, 1)
D112: 128+0 hint BM=64 BN=64 nw=4 ns=3 tma grid=(55, 16, 1)
D128: 128+0 hint BM=64 BN=64 nw=4 ns=3 tma grid=(55, 16, 1)
D256: 256+0 hint BM=128 BN=32 nw=8 ns=3 tma grid=(28, 16, 1)
D72/s76: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma copied grid=(28, 16, 1)
D72/s80: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)
D64 causal: 64+0 hint BM=128 BN=64 nw=8 ns=3 reversed grid=(28, 16, 1)
D72 causal: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma reversed grid=(28, 16, 1)
D256 causal: 256+0 hint BM=128 BN=32 nw=8 ns=3 tma reversed grid=(28, 16, 1)""")

    def test_generic(self):
        self.assertExpectedInline(_table("sm_80"), """\
D64: 64+0 hint BM=128 BN=64 nw=4 ns=2 grid=(28, 16, 1)
D72: 64+16 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D80: 64+16 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D88: 64+32 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D96: 64+32 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D112: 128+0 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D128: 128+0 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D256: 256+0 hint BM=64 BN=32 nw=4 ns=1 grid=(55, 16, 1)
D72/s76: 64+16 hint BM=128 BN=64 nw=8 ns=2 copied grid=(28, 16, 1)
D72/s80: 64+16 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D64 causal: 64+0 hint BM=128 BN=64 nw=4 ns=2 reversed grid=(28, 16, 1)
D72 causal: 64+16 hint BM=128 BN=64 nw=8 ns=2 reversed grid=(28, 16, 1)
D256 causal: 256+0 hint BM=64 BN=32 nw=4 ns=1 reversed grid=(55, 16, 1)""")


def test_the_causal_fact_reaches_the_table():
    """A rule keyed on ``causal`` is honoured: the launcher hands the table the launch's
    causality (the committed tables do not key on it yet, so the expect tables cannot show it)."""
    kernel = tuning.KERNELS["prefill"]
    kernel.builtin["test-causal"] = {"arch": "test-causal", "rules": [
        {"match": {"causal": True}, "config": {"BLOCK_M": 64, "num_warps": 4}},
        {"config": {"BLOCK_M": 128}},
    ]}
    tuning.table.cache_clear()
    try:
        assert "BM=64 BN=64 nw=4" in _row("test-causal", 72, causal=True)
        assert "BM=128 BN=64 nw=8" in _row("test-causal", 72, causal=False)
    finally:
        del kernel.builtin["test-causal"]
        tuning.table.cache_clear()


def test_gfx1151_narrow_tile_needs_the_hint():
    """Seed 001: BLOCK_N=16 / 4 warps only for the (64, 16) split with aligned strides."""
    assert "BN=16 nw=4" in _row("gfx1151", 72)
    assert "BN=16 nw=4" in _row("gfx1151", 80)
    assert "BN=32 nw=8" in _row("gfx1151", 72, head_stride=76)
    assert "BN=16" not in _row("gfx1151", 96)


def test_tma_needs_the_aligned_strides():
    """TMA is taken only where the alignment hint holds, for 16-bit dtypes."""
    tma = {"tma": True}
    assert " tma" in _row("gfx1151", 72, config=tma)
    assert " tma" not in _row("gfx1151", 72, head_stride=76, config=tma)  # HIP: no copy
    assert " tma" not in _row("sm_90", 72, config={**tma, "aligned": False})
    assert " tma" not in _row("sm_90", 72, config=tma, dtype=torch.float32)
    assert " tma" in _row("sm_90", 72, head_stride=76, config=tma)  # on the aligned copy


def test_unaligned_views_copied_where_the_workaround_applies():
    """The copy is a compiler workaround keyed on the backend (CUDA, this triton), not on the
    GPU or the table: sm_90 and sm_80 copy, gfx1151 and the interpreter run the hint-less
    kernel, ``aligned=False`` opts out, and aligned views are never copied."""
    with mock_platform("sm_90", interpret=False) as plat:
        assert tuning.workaround_active("prefill_unaligned_copy", plat)
    for arch in ("sm_90", "sm_80"):
        assert "copied" in _row(arch, 72, head_stride=76)
        assert "nohint" not in _row(arch, 72, head_stride=76)
        assert "copied" not in _row(arch, 72, head_stride=80)
        assert "copied" not in _row(arch, 72, head_stride=76, config={"aligned": False})
    assert "copied" not in _row("gfx1151", 72, head_stride=76)
    assert "copied" not in _row("sm_90", 72, head_stride=76, interpret=True)


def test_waves_per_eu_only_on_hip():
    assert "wpe=2" in _row("gfx1151", 64, config={"waves_per_eu": 2})
    assert "wpe" not in _row("gfx1151", 64)  # 0: unset
    assert "wpe" not in _row("sm_90", 64, config={"waves_per_eu": 2})


@pytest.mark.parametrize("key,kwarg", [("BLOCK_M", "BLOCK_M"), ("BLOCK_N", "BLOCK_N"),
                                       ("num_warps", "num_warps"), ("num_stages", "num_stages"),
                                       ("num_stages", "NUM_STAGES")])
def test_config_wins(key, kwarg):
    value = {"BLOCK_M": 16, "BLOCK_N": 8, "num_warps": 2, "num_stages": 5}[key]  # in no table
    for arch in ("sm_90", "gfx1151", "sm_80"):
        assert _launch(arch, 72).kwargs[kwarg] != value
        assert _launch(arch, 72, config={key: value}).kwargs[kwarg] == value
