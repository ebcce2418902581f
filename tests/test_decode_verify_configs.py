"""Which launch config and split cap each architecture picks, asserted on any machine.

``mock_platform`` pretends to be each GPU, so the tables ``mla_ops.tuning`` holds for the verify
kernel (sm_90: ``decode_verify/tables/sm_90.json``; gfx942: the MI300X sweeps' built-in table; every
other arch: the generic default) are pinned here as expect tables, with the split cap
``verify_num_kv_splits`` derives from each selection. A retune is a data change; regenerate
with ``EXPECTTEST_ACCEPT=1 pytest tests/test_decode_verify_configs.py``. The table format,
selection and validation themselves are ``tests/test_tuning.py``'s.
"""

from __future__ import annotations

import json

import expecttest
import pytest

import mla_ops  # noqa: F401
from mla_ops import tuning
from mla_ops.decode_verify import configs
from mla_ops.decode_verify.launch import reachable_batches, select_verify_config
from mla_ops.decode_verify.splits import verify_num_kv_splits, verify_row_blocks
from mla_ops.platform import mock_platform

# (batch, qlen, heads): the ANCHORS.md shapes M1..M7 and the edges of the small buckets.
SHAPES = [
    (1, 2, 16), (32, 2, 16), (128, 4, 16), (16, 2, 16), (128, 1, 128), (32, 4, 128), (16, 2, 128),
    (20, 2, 16), (21, 2, 16), (5, 1, 128), (6, 1, 128), (1, 8, 20), (4, 2, 16), (5, 2, 16),
]
# (max_seq_len, batch, qlen, heads) for the split cap.
SPLIT_SHAPES = [
    (8192, 1, 2, 16), (4096, 32, 2, 16), (4096, 128, 4, 16), (32768, 16, 2, 16),
    (4096, 128, 1, 128), (4096, 32, 4, 128), (32768, 16, 2, 128), (100, 1, 1, 16), (1, 4, 2, 16),
]
ARCHS = ["sm_90", "gfx942", "sm_80"]


def _cfg_row(batch, qlen, heads):
    c = select_verify_config(batch, qlen, heads)
    hip = "".join(f" {k}={c[k]}" for k in configs.HIP_LAUNCH_KEYS if k in c)
    return (f"B{batch}-q{qlen}-H{heads}: {c['family']} BH={c['BLOCK_H']} BN={c['BLOCK_N']} "
            f"nw={c['num_warps']} ns={c['num_stages']} qs={c['QSPLIT']} align={c['SPLIT_ALIGN']} "
            f"min={c['MIN_SPLIT_LEN']} s2={c['S2_BLOCK_S']}/{c['s2_num_warps']}/{c['S2_BLOCK_DV']}"
            f" swap={c['SWAP_AB']} tma={c['TMA']} pers={c['PERSISTENT']} pdl={c['PDL']}{hip} "
            f"rb={verify_row_blocks(qlen, heads, c['BLOCK_H'])}")


def _table(arch):
    with mock_platform(arch):
        return "\n".join(_cfg_row(*s) for s in SHAPES)


def _splits(arch):
    """The split cap with every default (the selected config's BLOCK_H and MIN_SPLIT_LEN, the
    platform's SM count), as plan_verify and the benchmarks call it."""
    rows = []
    with mock_platform(arch) as plat:
        for L, b, q, h in SPLIT_SHAPES:
            c = select_verify_config(b, q, h)
            n = verify_num_kv_splits(L, b, q, h)
            rows.append(f"L{L}-B{b}-q{q}-H{h} sms={plat.sm_count} BH={c['BLOCK_H']} "
                        f"min={c['MIN_SPLIT_LEN']}: {n}")
    return "\n".join(rows)


class TestVerifyTables(expecttest.TestCase):
    def test_sm_90(self):
        self.assertExpectedInline(_table("sm_90"), """\
B1-q2-H16: triton BH=16 BN=64 nw=4 ns=2 qs=1 align=64 min=128 s2=32/4/64 swap=1 tma=1 pers=0 pdl=1 rb=2
B32-q2-H16: triton BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B128-q4-H16: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=16/4/0 swap=0 tma=1 pers=1 pdl=0 rb=1
B16-q2-H16: triton BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B128-q1-H128: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B32-q4-H128: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=8
B16-q2-H128: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=4
B20-q2-H16: triton BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B21-q2-H16: triton BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1
B5-q1-H128: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B6-q1-H128: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=8/2/0 swap=0 tma=1 pers=0 pdl=0 rb=2
B1-q8-H20: triton BH=64 BN=64 nw=8 ns=2 qs=1 align=64 min=512 s2=16/4/0 swap=0 tma=1 pers=1 pdl=0 rb=3
B4-q2-H16: triton BH=16 BN=64 nw=4 ns=2 qs=1 align=64 min=128 s2=16/4/64 swap=1 tma=1 pers=0 pdl=1 rb=2
B5-q2-H16: triton BH=32 BN=64 nw=4 ns=2 qs=1 align=64 min=512 s2=8/4/0 swap=1 tma=1 pers=0 pdl=0 rb=1""")

    def test_gfx942(self):
        self.assertExpectedInline(_table("gfx942"), """\
B1-q2-H16: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B32-q2-H16: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B128-q4-H16: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B16-q2-H16: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B128-q1-H128: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=2
B32-q4-H128: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=8
B16-q2-H128: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=4
B20-q2-H16: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B21-q2-H16: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=1
B5-q1-H128: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=4
B6-q1-H128: triton BH=64 BN=32 nw=4 ns=2 qs=1 align=64 min=256 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=1 matrix_instr_nonkdim=16 kpack=1 rb=2
B1-q8-H20: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=5
B4-q2-H16: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1
B5-q2-H16: triton BH=32 BN=32 nw=4 ns=1 qs=0 align=32 min=128 s2=16/4/0 swap=0 tma=0 pers=0 pdl=0 waves_per_eu=2 matrix_instr_nonkdim=16 kpack=1 rb=1""")

    def test_default(self):
        self.assertExpectedInline(_table("sm_80"), """\
B1-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B32-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B128-q4-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=2
B16-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B128-q1-H128: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B32-q4-H128: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=16
B16-q2-H128: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=8
B20-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B21-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B5-q1-H128: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B6-q1-H128: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=4
B1-q8-H20: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=5
B4-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1
B5-q2-H16: triton BH=32 BN=32 nw=4 ns=2 qs=0 align=64 min=256 s2=8/4/0 swap=0 tma=0 pers=0 pdl=0 rb=1""")

    def test_split_caps_sm_90(self):
        self.assertExpectedInline(_splits("sm_90"), """\
L8192-B1-q2-H16 sms=132 BH=16 min=128: 66
L4096-B32-q2-H16 sms=132 BH=32 min=512: 4
L4096-B128-q4-H16 sms=132 BH=64 min=512: 1
L32768-B16-q2-H16 sms=132 BH=32 min=512: 8
L4096-B128-q1-H128 sms=132 BH=64 min=512: 1
L4096-B32-q4-H128 sms=132 BH=64 min=512: 1
L32768-B16-q2-H128 sms=132 BH=64 min=512: 2
L100-B1-q1-H16 sms=132 BH=16 min=64: 2
L1-B4-q2-H16 sms=132 BH=16 min=128: 1""")

    def test_split_caps_gfx942(self):
        self.assertExpectedInline(_splits("gfx942"), """\
L8192-B1-q2-H16 sms=304 BH=32 min=128: 128
L4096-B32-q2-H16 sms=304 BH=64 min=256: 9
L4096-B128-q4-H16 sms=304 BH=64 min=256: 2
L32768-B16-q2-H16 sms=304 BH=32 min=128: 19
L4096-B128-q1-H128 sms=304 BH=64 min=256: 1
L4096-B32-q4-H128 sms=304 BH=64 min=256: 1
L32768-B16-q2-H128 sms=304 BH=64 min=256: 4
L100-B1-q1-H16 sms=304 BH=32 min=128: 2
L1-B4-q2-H16 sms=304 BH=32 min=128: 1""")

    def test_num_kv_splits_algorithm(self):
        # A fixed tile and split length (32 rows, 64 tokens), given explicitly.
        fixed = dict(block_h=32, min_work_per_split=64)
        # Fits one round: as many splits as fill it, capped by the length's ideal and 2*SMs.
        self.assertEqual(verify_num_kv_splits(8192, 1, 2, 16, 132, **fixed), 128)
        self.assertEqual(verify_num_kv_splits(100, 1, 2, 16, 132, **fixed), 2)
        self.assertEqual(verify_num_kv_splits(10 ** 6, 1, 2, 16, 100, **fixed), 100)
        # More programs than slots: minimise rounds(n)/n, fewer splits within 5%.
        self.assertEqual(verify_num_kv_splits(4096, 128, 4, 16, 132, block_h=64,
                                              min_work_per_split=64), 1)
        # 200 programs on 132 slots: rounds/n is 1.571 at n=7, and n=5 (1.6) is within 5%.
        self.assertEqual(verify_num_kv_splits(4096, 200, 1, 16, 132, max_splits=8, **fixed), 5)


@pytest.mark.parametrize("arch", ARCHS)
def test_split_cap_defaults_are_the_selected_config_and_this_gpu(arch):
    """block_h / min_work_per_split default to the BLOCK_H / SPLIT_WORK of the config the
    table selects for that batch, sm_count to the platform's: never a fixed 32 / 64 (which
    disagree with the sm_90 table and cost up to 2x on the H200)."""
    differs_from_fixed = 0
    with mock_platform(arch) as plat:
        for L, b, q, h in SPLIT_SHAPES + [(2048, 3, 3, 20), (700, 2, 1, 64)]:
            c = select_verify_config(b, q, h)
            got = verify_num_kv_splits(L, b, q, h)
            assert got == verify_num_kv_splits(L, b, q, h, plat.sm_count, block_h=c["BLOCK_H"],
                                               min_work_per_split=c["SPLIT_WORK"])
            differs_from_fixed += got != verify_num_kv_splits(L, b, q, h, plat.sm_count,
                                                             block_h=32, min_work_per_split=64)
    if arch in ("sm_90", "gfx942"):  # tables whose tiles are not all 32 rows
        assert differs_from_fixed, "no shape tells the defaults from the fixed 32 / 64"


@pytest.mark.parametrize("arch", ARCHS)
def test_gluon_family_only_where_the_gluon_fact_holds(arch):
    """A rule selects the sm_90 Gluon family only under ``"gluon": true`` (GPU, triton, dtypes,
    head dims and page size it covers): every other launch keeps the portable kernel, and a
    family nobody registered is refused by name."""
    assert set(configs.KERNEL.defaults) == {"triton", "gluon"}
    with mock_platform(arch):
        for rule in tuning.table("decode_verify", arch)["rules"]:
            if rule["config"].get("family", "triton") == "gluon":
                assert rule.get("match", {}).get("gluon") is True, rule
        with pytest.raises(ValueError, match="^config: unknown kernel family 'cutlass'"):
            select_verify_config(1, 2, 16, config={"family": "cutlass"})
        for batch in (1, 32, 128):
            assert select_verify_config(batch, 2, 16, gluon=False)["family"] == "triton"


@pytest.mark.parametrize("arch", ARCHS)
def test_hip_keys_only_in_the_gfx942_table(arch):
    for rule in tuning.table("decode_verify", arch)["rules"]:
        has_hip = any(k in rule["config"] for k in configs.HIP_LAUNCH_KEYS)
        assert has_hip == (arch == "gfx942"), rule


def test_sm_90_selection_is_the_committed_json_file():
    """The sm_90 launches use decode_verify/tables/sm_90.json (read here with json, not through
    the tuning module): its rules in its order, each config laid over the triton defaults."""
    path = configs.KERNEL.table_dir / "sm_90.json"
    raw = json.loads(path.read_text())
    assert raw["kernel"] == "decode_verify" and raw["arch"] == "sm_90"
    assert tuning.table("decode_verify", "sm_90")["rules"] == raw["rules"]
    # the first portable rule: H in [1..32], qlen 1 (the Gluon rules before it need "gluon")
    first = next(r for r in raw["rules"] if r["config"].get("family", "triton") == "triton")
    assert first["match"]["qlen"] == [1] and 16 in first["match"]["num_heads"]
    with mock_platform("sm_90"):
        got = select_verify_config(1, 1, 16)
    assert got == {**configs.VERIFY_DEFAULT_CONFIG, "family": "triton", **first["config"]}
    # ... and the file is no copy of the generic default that every other arch gets.
    with mock_platform("sm_80"):
        assert select_verify_config(1, 1, 16) != got


@pytest.mark.parametrize("arch", ARCHS)
def test_reachable_batches_cover_every_config(arch):
    """The warmup's representative batches reach every config any batch can select."""
    with mock_platform(arch):
        for qlen in (1, 2, 4, 8):
            for heads in (16, 20, 128):
                reached = [select_verify_config(b, qlen, heads)
                           for b in reachable_batches(qlen, heads)]
                for batch in range(1, 257):
                    assert select_verify_config(batch, qlen, heads) in reached, (qlen, heads, batch)


# (batch, qlen, H, fp8) -> the sm_90 table's Gluon schedule, and SWAPAB_BLOCKS where it is swapab.
SM90_GLUON_ROUTES = [
    ((32, 2, 16, False), ("swapab", 0)),  # M2: bf16 of <= 32 rows, both groups score every block
    ((16, 2, 16, True), ("swapab", 1)),  # M4: fp8 of <= 32 rows, the groups on alternate blocks
    ((128, 1, 16, True), ("swapab", 1)),
    ((32, 1, 32, True), ("swapab", 1)),
    ((128, 1, 32, False), ("swapab", 0)),
    ((32, 4, 16, True), ("alt", None)),  # 64 rows per request: the converter warps on alt
    ((16, 2, 128, True), ("alt", None)),  # M7
    ((128, 4, 16, False), ("seesaw", None)),  # M3
    ((1, 4, 128, False), ("seesaw", None)),  # 512 rows at qlen 4: Gluon from 128 rows at every qlen
    ((1, 4, 128, True), ("alt", None)),
]


# (batch, qlen, H, fp8) -> whether the sm_90 table hands over on named barriers (NAMED_EXCHANGE):
# its seesaw rules at H >= 64 from 8192 to 16384 rows and at H 16/32 from 4096 rows, where two
# A/B runs agree (benchmarks/NOTES.md, the sm_90 family's Tried), nowhere else.
SM90_NAMED_ROUTES = [
    ((128, 1, 128, False), 1),  # M5
    ((32, 4, 128, False), 1),  # M6
    ((32, 2, 128, False), 1),  # 8192 rows
    ((128, 4, 16, False), 1),  # M3
    ((32, 1, 128, False), 0),  # 4096 rows at H128: the seesaw without STAGE_ORDER
    ((1, 2, 128, False), 0),  # B1: the same
    ((128, 2, 128, False), 0),  # 32768 rows: alt with QK_FIRST
    ((32, 4, 16, False), 0),  # H16 alt (2048 rows)
    ((16, 2, 128, True), 0),  # M7: fp8 alt
    ((32, 2, 16, False), 0),  # M2: swap-AB
]


@pytest.mark.parametrize("facts,named", SM90_NAMED_ROUTES, ids=[str(f) for f, _ in SM90_NAMED_ROUTES])
def test_sm_90_named_exchange_rules(facts, named):
    """NAMED_EXCHANGE is on exactly where the table's A/B runs kept it."""
    batch, qlen, heads, fp8 = facts
    with mock_platform("sm_90"):
        got = select_verify_config(batch, qlen, heads, fp8=fp8, gluon=True)
    assert got["family"] == "gluon"
    assert got["NAMED_EXCHANGE"] == named


@pytest.mark.parametrize("facts,route", SM90_GLUON_ROUTES, ids=[str(f) for f, _ in SM90_GLUON_ROUTES])
def test_sm_90_gluon_schedules(facts, route):
    """The sm_90 table's Gluon rules route each class of launch to the schedule its A/B picked
    (README, "Decode verify"): swap-AB for requests of at most 32 rows, with the groups on
    alternate blocks only for fp8 caches."""
    batch, qlen, heads, fp8 = facts
    with mock_platform("sm_90"):
        got = select_verify_config(batch, qlen, heads, fp8=fp8, gluon=True)
    assert got["family"] == "gluon"
    assert got["SCHEDULE"] == route[0]
    if route[1] is not None:
        assert got["SWAPAB_BLOCKS"] == route[1]


# (batch, qlen, H, fp8) -> (BLOCK_H, MIN_SPLIT_LEN, S2_BLOCK_S) of the sm_90 table's portable
# rules at few rows (benchmarks/NOTES.md, the portable kernel at batch 1).
SM90_FEW_ROW_ROUTES = [
    ((1, 1, 16, False), (16, 64, 128)),  # 16 rows: 64-key splits, the merge in one step
    ((1, 1, 16, True), (16, 64, 128)),
    ((2, 1, 16, False), (16, 128, 32)),
    ((1, 1, 32, True), (16, 128, 32)),
    ((16, 1, 16, False), (16, 128, 16)),  # past 128 rows (the Gluon family's on the H200)
    ((1, 2, 16, False), (16, 128, 32)),  # M1
    ((2, 2, 16, True), (16, 128, 16)),
    ((1, 4, 16, True), (32, 128, 32)),  # fp8 at qlen 4: 32-row tiles
    ((2, 4, 16, True), (32, 128, 32)),
    ((1, 4, 16, False), (16, 128, 32)),
    ((4, 4, 16, False), (16, 128, 32)),
    ((4, 4, 16, True), (16, 128, 16)),
    ((1, 3, 16, True), (16, 128, 16)),
]


@pytest.mark.parametrize("facts,route", SM90_FEW_ROW_ROUTES,
                         ids=[str(f) for f, _ in SM90_FEW_ROW_ROUTES])
def test_sm_90_few_row_portable_rules(facts, route):
    """The portable rules at batch 1 and a few more rows pick the tile, the split length and
    the merge step their A/B measured, and only up to the rows it measured."""
    batch, qlen, heads, fp8 = facts
    with mock_platform("sm_90"):
        got = select_verify_config(batch, qlen, heads, fp8=fp8)
    assert got["family"] == "triton"
    assert (got["BLOCK_H"], got["MIN_SPLIT_LEN"], got["S2_BLOCK_S"]) == route


# (batch, qlen, H, fp8) -> S2_BLOCK_S of the sm_90 table's Gluon launches at H >= 64: the merge
# takes 32 splits a step up to 256 rows (B1 L8k runs 32 splits), 8 above.
SM90_GLUON_MERGE_STEPS = [((1, 1, 128, False), 32), ((1, 2, 128, True), 32), ((2, 1, 128, False), 32),
                          ((4, 1, 64, True), 32), ((1, 4, 128, False), 8), ((1, 4, 128, True), 8),
                          ((16, 2, 128, False), 8), ((16, 2, 128, True), 8)]


@pytest.mark.parametrize("facts,steps", SM90_GLUON_MERGE_STEPS,
                         ids=[str(f) for f, _ in SM90_GLUON_MERGE_STEPS])
def test_sm_90_gluon_merge_steps(facts, steps):
    batch, qlen, heads, fp8 = facts
    with mock_platform("sm_90"):
        got = select_verify_config(batch, qlen, heads, fp8=fp8, gluon=True)
    assert got["family"] == "gluon" and got["S2_BLOCK_S"] == steps
