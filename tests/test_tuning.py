"""mla_ops.tuning: the one table format of both kernels, its selection, overrides and the
compiler workarounds keyed on the triton version."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

import mla_ops  # noqa: F401  (registers the kernels with the tuning module)
from mla_ops import tuning
from mla_ops.platform import mock_platform

KERNEL_ARCHS = [(k, a) for k in ("decode_verify", "prefill") for a in ("sm_90", "gfx942",
                                                                       "gfx1151", "sm_80")]


@pytest.mark.parametrize("version", [(3, 6, 0), (3, 9, 0), (4, 0, 0)], ids=str)
def test_a_workaround_stays_on_past_the_last_checked_triton(version, monkeypatch):
    """A triton newer than the one a compiler bug was last checked on keeps the workaround (the
    safe path) and names it as unchecked, until a GPU run moves ``last_checked`` or sets
    ``fixed_in``."""
    monkeypatch.setattr(tuning, "triton_version", lambda: version)
    with mock_platform("sm_90", interpret=False) as plat:
        for name, w in tuning.WORKAROUNDS.items():
            if w.backend == "cuda" and w.fixed_in is None:
                assert tuning.workaround_active(name, plat), name
                newer = version > tuning._version_tuple(w.last_checked)
                assert (name in tuning.unchecked_workarounds()) == newer, (name, version)


def test_a_workaround_ends_where_it_was_fixed(monkeypatch):
    fixed = dataclasses.replace(tuning.WORKAROUNDS["swap_ab_min_stages"], fixed_in="3.9.0")
    monkeypatch.setitem(tuning.WORKAROUNDS, "swap_ab_min_stages", fixed)
    with mock_platform("sm_90", interpret=False) as plat:
        monkeypatch.setattr(tuning, "triton_version", lambda: (3, 8, 1))
        assert tuning.workaround_active("swap_ab_min_stages", plat)
        monkeypatch.setattr(tuning, "triton_version", lambda: (3, 9, 0))
        assert not tuning.workaround_active("swap_ab_min_stages", plat)
        assert "swap_ab_min_stages" not in tuning.unchecked_workarounds()


def _launches(kernel):
    """The facts of every launch shape a serving engine can make (decode: heads, qlen, batch,
    cache, family available; encoder: head dims 16..256, aligned or not, causal or not, Gluon
    family available or not)."""
    if kernel == "decode_verify":
        for heads in (1, 2, 4, 8, 16, 20, 32, 64, 128, 256):
            for qlen in range(1, 17):
                for batch in (1, 2, 3, 4, 8, 16, 22, 32, 44, 64, 88, 128, 256, 512):
                    for cache in ("16bit", "fp8"):
                        for gluon in (False, True):
                            yield {"rows": batch * qlen * heads, "num_heads": heads,
                                   "qlen": qlen, "cache": cache, "gluon": gluon}
    else:
        from mla_ops.prefill.configs import prefill_facts
        from mla_ops.prefill.launch import head_dim_split

        for d in range(16, 257):
            for aligned in (False, True):
                for causal in (False, True):
                    for gluon in (False, True):
                        yield prefill_facts(d, head_dim_split(d), aligned, causal, gluon)


@pytest.mark.parametrize("kernel,arch", KERNEL_ARCHS, ids=[f"{k}-{a}" for k, a in KERNEL_ARCHS])
def test_every_rule_of_every_table_is_reachable(kernel, arch):
    """Each rule is the first match of some launch an engine can make: no rule is shadowed by
    an earlier one or matches facts no launch has (e.g. a split written as [64, 16])."""
    rules = tuning.table(kernel, arch)["rules"]
    used = set()
    for facts in _launches(kernel):
        used.add(next(i for i, r in enumerate(rules) if tuning._matches(r.get("match", {}), facts)))
    assert used == set(range(len(rules))), f"unreachable rules {set(range(len(rules))) - used}"


def test_first_matching_rule_wins_with_bounds_and_lists():
    kernel = tuning.KERNELS["decode_verify"]
    tbl = {"arch": "test", "rules": [
        {"match": {"num_heads": [16, 32], "rows_max": 128}, "config": {"BLOCK_H": 16}},
        {"match": {"rows_min": 129, "qlen": 2}, "config": {"BLOCK_H": 64}},
        {"config": {"BLOCK_H": 32}},
    ]}
    kernel.builtin["test"] = tbl
    tuning.table.cache_clear()
    try:
        def pick(rows, heads, qlen):
            facts = {"rows": rows, "num_heads": heads, "qlen": qlen, "cache": "16bit",
                     "gluon": False}
            return tuning.select("decode_verify", facts, arch="test")["BLOCK_H"]

        assert pick(128, 16, 2) == 16
        assert pick(128, 8, 2) == 32  # 8 heads: not in the list
        assert pick(129, 16, 2) == 64  # past the first rule's bound
        assert pick(129, 16, 3) == 32
        assert tuning.thresholds("decode_verify", "rows", arch="test") == [128, 129]
    finally:
        del kernel.builtin["test"]
        tuning.table.cache_clear()


def test_selection_is_remembered_per_table_and_returned_fresh():
    """``select`` remembers the rule a launch's facts matched (an eager launch selects on every
    call), but a reloaded table is scanned again, and every caller gets its own dict."""
    kernel = tuning.KERNELS["decode_verify"]
    facts = {"rows": 64, "num_heads": 16, "qlen": 2, "cache": "16bit", "gluon": False}
    kernel.builtin["test"] = {"arch": "test", "rules": [{"config": {"BLOCK_H": 16}}]}
    tuning.table.cache_clear()
    try:
        first = tuning.select("decode_verify", facts, arch="test")
        first["BLOCK_H"] = 99
        assert tuning.select("decode_verify", facts, arch="test")["BLOCK_H"] == 16
        kernel.builtin["test"] = {"arch": "test", "rules": [{"config": {"BLOCK_H": 64}}]}
        tuning.table.cache_clear()
        assert tuning.select("decode_verify", facts, arch="test")["BLOCK_H"] == 64
    finally:
        del kernel.builtin["test"]
        tuning.table.cache_clear()


def test_config_override_is_validated_and_laid_over_the_selection():
    facts = {"rows": 64, "num_heads": 16, "qlen": 2, "cache": "16bit", "gluon": False}
    with mock_platform("sm_90"):
        base = tuning.select("decode_verify", facts)
        got = tuning.select("decode_verify", facts, config={"BLOCK_N": 16})
        assert got == {**base, "BLOCK_N": 16}
        with pytest.raises(ValueError, match=r"config: unknown config keys \['BLOCK_M'\]"):
            tuning.select("decode_verify", facts, config={"BLOCK_M": 16})
        with pytest.raises(ValueError, match="unknown kernel family 'cuda'"):
            tuning.select("decode_verify", facts, config={"family": "cuda"})


@pytest.mark.parametrize("interpret,refused", [(False, True), (True, False)],
                         ids=["cuda", "interpreter"])
def test_swap_ab_unpipelined_refused_where_the_compiler_bug_applies(interpret, refused):
    """The bug is the CUDA backend's (keyed on triton, not on the GPU): refused in overrides
    and in sm_* tables there, allowed under the interpreter."""
    facts = {"rows": 64, "num_heads": 16, "qlen": 2, "cache": "16bit", "gluon": False}
    bad = {"SWAP_AB": 1, "num_stages": 1}
    kernel = tuning.KERNELS["decode_verify"]
    with mock_platform("sm_90", interpret=interpret):
        if refused:
            with pytest.raises(ValueError, match="SWAP_AB with num_stages 1 is refused"):
                tuning.select("decode_verify", facts, config=bad)
            tbl = copy.deepcopy(tuning.table("decode_verify", "sm_90"))
            i = next(i for i, r in enumerate(tbl["rules"])
                     if r["config"].get("family", "triton") == "triton")
            tbl["rules"][i]["config"].update(bad)
            with pytest.raises(ValueError, match=f"rule {i}: SWAP_AB"):
                tuning.validate(kernel, tbl)
        else:
            assert tuning.select("decode_verify", facts, config=bad)["num_stages"] == 1


@pytest.mark.parametrize("edit,message", [
    (lambda t: t["rules"].pop(), "the last rule must match every launch"),
    (lambda t: t["rules"][0]["match"].update(batch_max=3), r"unknown facts \['batch'\]"),
    (lambda t: t["rules"][0]["config"].update(BLOCK_X=3), r"unknown config keys \['BLOCK_X'\]"),
    (lambda t: t.update(rules=[]), "no rules"),
], ids=["no-catch-all", "unknown-fact", "unknown-key", "empty"])
def test_bad_tables_are_refused(edit, message):
    tbl = copy.deepcopy(tuning.table("decode_verify", "sm_90"))
    edit(tbl)
    with pytest.raises(ValueError, match=message):
        tuning.validate(tuning.KERNELS["decode_verify"], tbl)


@pytest.mark.parametrize("kernel", ["decode_verify", "prefill"])
def test_format_table_round_trips_the_committed_table(kernel):
    """What the sweeps write is what loads: the committed sm_90 table, re-formatted, is the
    same data (the formatter is the one writer of table files)."""
    tbl = tuning.table(kernel, "sm_90")
    text = tuning.format_table(kernel, "sm_90", tbl["rules"], tbl["source"], tbl.get("env"))
    assert json.loads(text) == {k: tbl[k] for k in ("kernel", "arch", "source", "env", "rules")}
    path = tuning.KERNELS[kernel].table_dir / "sm_90.json"
    assert path.read_text() == text, "the committed table is not in the formatter's layout"
