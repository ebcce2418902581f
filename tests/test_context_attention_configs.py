"""Which launch each architecture picks, asserted on any machine.

``capture_launches`` records the launch ``context_attention_fwd`` would make without running
it, and ``mock_platform`` pretends to be each GPU, so the sm_90 (H200 sweep), gfx1151 (seed
001) and generic tables are pinned here as expect tables. A retune of a table is a data
change; regenerate these with ``EXPECTTEST_ACCEPT=1 pytest tests/test_context_attention_configs.py``.
"""

from __future__ import annotations

import expecttest
import pytest
import torch

import mla_ops  # noqa: F401
from mla_ops.platform import mock_platform
from mla_ops.prefill import launch as L

HEAD_DIMS = [64, 72, 80, 88, 96, 112, 128, 256]


def _meta_args(head_dim, head_stride=None, causal=False):
    """Meta tensors for one B=1 S=3520 H=16 launch; ``head_stride`` pads the head axis."""
    hs = head_stride or head_dim
    buf = torch.empty(3520, 16, hs, dtype=torch.bfloat16, device="meta")
    t = buf[:, :, :head_dim]
    idx = torch.zeros(1, dtype=torch.int32, device="meta")
    return (t, t, t, t, idx, idx, 3520, causal)


def _row(arch, head_dim, head_stride=None, causal=False):
    with mock_platform(arch), L.capture_launches() as launches:
        L.context_attention_fwd(*_meta_args(head_dim, head_stride, causal))
    (launch,) = launches
    c = launch.config
    split = f"{c['BLOCK_D']}+{c['BLOCK_D_TAIL']}"
    hint = "hint" if c["HEAD_STRIDE_ALIGNED_8"] else "nohint"
    extra = " tma" if c["USE_TMA"] else ""
    extra += " copied" if launch.copied else ""
    extra += f" wpe={c['waves_per_eu']}" if "waves_per_eu" in c else ""
    stride = f"/s{head_stride}" if head_stride else ""
    return (f"D{head_dim}{stride}: {split} {hint} BM={c['BLOCK_M']} BN={c['BLOCK_N']} "
            f"nw={c['num_warps']} ns={c['num_stages']}{extra} grid={launch.grid}")


def _table(arch, causal=False):
    rows = [_row(arch, d, causal=causal) for d in HEAD_DIMS]
    rows.append(_row(arch, 72, head_stride=76, causal=causal))  # padded: 76 % 8 != 0, no hint
    rows.append(_row(arch, 72, head_stride=80, causal=causal))  # padded but 8-aligned: hint on
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
D72/s80: 64+16 hint BM=128 BN=16 nw=4 ns=1 grid=(28, 16, 1)""")

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
D72/s80: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)""")

    def test_sm_90_causal(self):
        self.assertExpectedInline(_table("sm_90", causal=True), """\
D64: 64+0 hint BM=128 BN=64 nw=8 ns=3 grid=(28, 16, 1)
D72: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)
D80: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)
D88: 64+32 hint BM=128 BN=64 nw=4 ns=3 tma grid=(28, 16, 1)
D96: 64+32 hint BM=128 BN=64 nw=4 ns=3 tma grid=(28, 16, 1)
D112: 128+0 hint BM=64 BN=64 nw=4 ns=3 tma grid=(55, 16, 1)
D128: 128+0 hint BM=64 BN=64 nw=4 ns=3 tma grid=(55, 16, 1)
D256: 256+0 hint BM=128 BN=32 nw=8 ns=3 tma grid=(28, 16, 1)
D72/s76: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma copied grid=(28, 16, 1)
D72/s80: 64+16 hint BM=128 BN=64 nw=8 ns=3 tma grid=(28, 16, 1)""")

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
D72/s76: 64+16 nohint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)
D72/s80: 64+16 hint BM=128 BN=64 nw=8 ns=2 grid=(28, 16, 1)""")


def test_gfx1151_narrow_tile_needs_the_hint():
    """Seed 001: BLOCK_N=16 / 4 warps only for the (64, 16) split with aligned strides."""
    assert "BN=16 nw=4" in _row("gfx1151", 72)
    assert "BN=16 nw=4" in _row("gfx1151", 80)
    assert "BN=32 nw=8" in _row("gfx1151", 72, head_stride=76)
    assert "BN=16" not in _row("gfx1151", 96)


def test_tma_needs_the_aligned_strides(monkeypatch):
    from mla_ops.prefill import configs

    monkeypatch.setitem(configs.TABLES, "sm_90",
                        [dict(configs.SM90_FALLBACK[0], tma=True, unaligned_copy=False)])
    assert " tma " in _row("sm_90", 72) + " "
    assert " tma" not in _row("sm_90", 72, head_stride=76)


def test_unaligned_views_copied_where_the_table_says():
    """sm_90 runs odd-stride views on aligned copies; gfx1151 keeps the hint-less kernel."""
    assert "nohint" not in _row("sm_90", 72, head_stride=76)
    assert "copied" in _row("sm_90", 72, head_stride=76)
    assert "copied" not in _row("sm_90", 72, head_stride=80)
    assert "copied" not in _row("gfx1151", 72, head_stride=76)


def test_waves_per_eu_only_on_hip(monkeypatch):
    from mla_ops.prefill import configs

    monkeypatch.setitem(configs.TABLES, "gfx1151", [dict(configs.GFX1151[0], waves_per_eu=2)])
    assert "wpe=2" in _row("gfx1151", 64)
    monkeypatch.setitem(configs.TABLES, "sm_90", [dict(configs.GFX1151[0], waves_per_eu=2)])
    assert "wpe" not in _row("sm_90", 64)


@pytest.mark.parametrize("key", ["BLOCK_M", "BLOCK_N", "num_warps", "num_stages"])
def test_override_wins(key):
    with L.launch_overrides(**{key: 16}), L.capture_launches() as launches:
        L.context_attention_fwd(*_meta_args(72))
    assert launches[0].kwargs[key] == 16
