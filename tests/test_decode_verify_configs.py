"""Which launch config and split cap each architecture picks, asserted on any machine.

``mock_platform`` pretends to be each GPU, so the sm_90 (tables/sm_90.json), gfx942 (seed 000)
and generic tables are pinned here as expect tables. A retune is a data change; regenerate with
``EXPECTTEST_ACCEPT=1 pytest tests/test_decode_verify_configs.py``.
"""

from __future__ import annotations

import expecttest
import pytest

import mla_ops  # noqa: F401
from mla_ops.decode_verify import configs
from mla_ops.decode_verify.launch import select_verify_config, verify_num_kv_splits, verify_row_blocks
from mla_ops.platform import mock_platform

# (batch, qlen, heads): the ANCHORS.md shapes M1..M7 and the 640-row edge of the small bucket.
SHAPES = [
    (1, 2, 16), (32, 2, 16), (128, 4, 16), (16, 2, 16), (128, 1, 128), (32, 4, 128), (16, 2, 128),
    (20, 2, 16), (21, 2, 16), (5, 1, 128), (6, 1, 128), (1, 8, 20),
]
# (max_seq_len, batch, qlen, heads) for the split cap.
SPLIT_SHAPES = [
    (8192, 1, 2, 16), (4096, 32, 2, 16), (4096, 128, 4, 16), (32768, 16, 2, 16),
    (4096, 128, 1, 128), (4096, 32, 4, 128), (32768, 16, 2, 128), (100, 1, 1, 16), (1, 4, 2, 16),
]


def _cfg_row(batch, qlen, heads):
    c = select_verify_config(batch, qlen, heads)
    hip = "".join(f" {k}={c[k]}" for k in configs.HIP_LAUNCH_KEYS if k in c)
    return (f"B{batch}-q{qlen}-H{heads}: BH={c['BLOCK_H']} BN={c['BLOCK_N']} nw={c['num_warps']} "
            f"ns={c['num_stages']} qs={c['QSPLIT']} align={c['SPLIT_ALIGN']} "
            f"min={c['MIN_SPLIT_LEN']} s2={c['S2_BLOCK_S']}/{c['s2_num_warps']}/{c['S2_BLOCK_DV']}"
            f" swap={c['SWAP_AB']} tma={c['TMA']} pers={c['PERSISTENT']} pdl={c['PDL']}{hip} "
            f"rb={verify_row_blocks(qlen, heads, c['BLOCK_H'])}")


def _table(arch):
    with mock_platform(arch):
        return "\n".join(_cfg_row(*s) for s in SHAPES)


def _splits(arch):
    rows = []
    with mock_platform(arch) as plat:
        for L, b, q, h in SPLIT_SHAPES:
            bh = select_verify_config(b, q, h)["BLOCK_H"]
            n = verify_num_kv_splits(L, b, q, h, plat.sm_count, block_h=bh)
            rows.append(f"L{L}-B{b}-q{q}-H{h} sms={plat.sm_count} BH={bh}: {n}")
    return "\n".join(rows)


class TestVerifyTables(expecttest.TestCase):
    def test_sm_90(self):
        self.assertExpectedInline(_table("sm_90"), """\
B1-q2-H16: BH=16 BN=64 nw=4 ns=2 qs=1 align=64 min=128 s2=16/4/64 swap=1 tma=1 pers=0 pdl=1 rb=2
B32-q2-H16: BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B128-q4-H16: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=16/4/0 swap=0 tma=1 pers=1 pdl=0 rb=1
B16-q2-H16: BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B128-q1-H128: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B32-q4-H128: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=8
B16-q2-H128: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=4
B20-q2-H16: BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B21-q2-H16: BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B5-q1-H128: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B6-q1-H128: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B1-q8-H20: BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=16/4/0 swap=0 tma=1 pers=1 pdl=0 rb=3""")

    def test_gfx942(self):
        self.assertExpectedInline(_table("gfx942"), """\
B1-q2-H16: BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B32-q2-H16: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B128-q4-H16: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B16-q2-H16: BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B128-q1-H128: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=2
B32-q4-H128: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=8
B16-q2-H128: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=4
B20-q2-H16: BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B21-q2-H16: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B5-q1-H128: BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=4
B6-q1-H128: BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=2
B1-q8-H20: BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=5""")

    def test_default(self):
        self.assertExpectedInline(_table("sm_80"), """\
B1-q2-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B32-q2-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B128-q4-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=2
B16-q2-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B128-q1-H128: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B32-q4-H128: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=16
B16-q2-H128: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=8
B20-q2-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B21-q2-H16: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B5-q1-H128: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B6-q1-H128: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B1-q8-H20: BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=5""")

    def test_split_caps_sm_90(self):
        self.assertExpectedInline(_splits("sm_90"), """\
L8192-B1-q2-H16 sms=132 BH=16: 66
L4096-B32-q2-H16 sms=132 BH=32: 4
L4096-B128-q4-H16 sms=132 BH=64: 1
L32768-B16-q2-H16 sms=132 BH=32: 8
L4096-B128-q1-H128 sms=132 BH=64: 1
L4096-B32-q4-H128 sms=132 BH=64: 1
L32768-B16-q2-H128 sms=132 BH=64: 2
L100-B1-q1-H16 sms=132 BH=16: 2
L1-B4-q2-H16 sms=132 BH=16: 1""")

    def test_split_caps_gfx942(self):
        self.assertExpectedInline(_splits("gfx942"), """\
L8192-B1-q2-H16 sms=304 BH=32: 128
L4096-B32-q2-H16 sms=304 BH=64: 9
L4096-B128-q4-H16 sms=304 BH=64: 2
L32768-B16-q2-H16 sms=304 BH=32: 19
L4096-B128-q1-H128 sms=304 BH=64: 1
L4096-B32-q4-H128 sms=304 BH=64: 1
L32768-B16-q2-H128 sms=304 BH=64: 4
L100-B1-q1-H16 sms=304 BH=32: 2
L1-B4-q2-H16 sms=304 BH=32: 1""")

    def test_num_kv_splits_seed_algorithm(self):
        # Fits one round: as many splits as fill it, capped by the length's ideal and 2*SMs.
        self.assertEqual(verify_num_kv_splits(8192, 1, 2, 16, 132, block_h=32), 128)
        self.assertEqual(verify_num_kv_splits(100, 1, 2, 16, 132, block_h=32), 2)
        # More programs than slots: minimise rounds(n)/n, fewer splits within 5%.
        self.assertEqual(verify_num_kv_splits(4096, 128, 4, 16, 132, block_h=64), 1)
        # 200 programs on 132 slots: rounds/n is 1.571 at n=7, and n=5 (1.6) is within 5%.
        self.assertEqual(verify_num_kv_splits(4096, 200, 1, 16, 132, block_h=32, max_splits=8), 5)


def test_hip_keys_only_in_the_gfx942_table():
    for arch, table in configs.TABLES.items():
        for bucket in table["buckets"]:
            has_hip = any(k in bucket["config"] for k in configs.HIP_LAUNCH_KEYS)
            assert has_hip == (arch == "gfx942"), arch


def test_sm_90_table_is_the_json_file():
    assert configs.TABLES["sm_90"] == configs.load_table("sm_90")


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "sm_80"])
def test_reachable_configs_cover_every_batch(arch):
    """The warmup's representative batches reach every config any batch can select."""
    with mock_platform(arch):
        for qlen in (1, 2, 4, 8):
            for heads in (16, 20, 128):
                reached = [c for _, c in configs.reachable_verify_configs(qlen, heads)]
                for batch in range(1, 257):
                    assert select_verify_config(batch, qlen, heads) in reached


def test_sm_table_with_unpipelined_swap_ab_is_rejected():
    """num_stages 1 under SWAP_AB miscompiles on CUDA (Triton 3.6): no sm_* table may hold it."""
    from mla_ops.decode_verify import configs

    bad = {"arch": "sm_90", "buckets": [{"config": {"SWAP_AB": 1, "num_stages": 1}}]}
    with pytest.raises(ValueError, match="SWAP_AB"):
        configs._validate(bad)
    configs._validate({"arch": "sm_90", "buckets": [{"config": {"SWAP_AB": 1, "num_stages": 2}}]})
    configs._validate({"arch": "gfx942", "buckets": [{"config": {"SWAP_AB": 1, "num_stages": 1}}]})
