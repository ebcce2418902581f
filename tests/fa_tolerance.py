"""Flash-attention's accuracy rule, shared by the context-parallel tests.

A kernel's error against a float64 reference may be at most ``k`` times the error plain PyTorch
makes computing the same thing in the test's dtype, plus a floor: the rounding noise of the
output's own dtype at the result's magnitude. A fixed atol would pass a kernel that is wrong by
less than it; this scales with what the dtype can do.

The floor. flash-attention's tests take the noise as ``(ref + 0.3 - 0.3 - ref)`` rounded in the
dtype: one draw of two roundings, which is often 0 for a handful of values (four LSEs of a
rank: 1.99, 1.01, 4.22, 3.69 all survive +0.3 -0.3 in fp16 exactly). Where plain PyTorch's own
error is ~0 as well (an fp32 LSE, as accurate as a second kernel computing it) the bound was
then below one ulp of the result, which no second computation can promise: the sharded step's
LSE was refused at 3.4e-7 (0.7 ulp of fp32 at 4.2) against a bound of 2.7e-7. So the noise is
taken at its worst, deterministically: one ulp of the output's dtype at the largest ``|ref|``
(:func:`resolution`), twice, as flash-attention doubles its noise. It is the output's dtype
(an fp32 LSE's, not the fp16 of the test's inputs): a result can be no closer than its storage
allows, and need be no closer either.
"""

from __future__ import annotations

import math

import torch


def resolution(ref64: torch.Tensor, dtype: torch.dtype) -> float:
    """One ulp of ``dtype`` at the largest finite ``|ref64|``: the spacing of the values a
    result stored in ``dtype`` can take there (0 when nothing is finite)."""
    finite = ref64[torch.isfinite(ref64)]
    if finite.numel() == 0:
        return 0.0
    _, exponent = math.frexp(float(finite.abs().max()))  # max = m * 2**exponent, 0.5 <= m < 1
    return math.ldexp(torch.finfo(dtype).eps, exponent - 1)


def max_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    """Max |x - ref| over the entries where ref is finite (the -inf pattern is checked apart)."""
    finite = torch.isfinite(ref64)
    if not finite.any():
        return 0.0
    return float((x.double()[finite] - ref64[finite]).abs().max())


def assert_fa_rule(name: str, out: torch.Tensor, ref64: torch.Tensor, out_pt: torch.Tensor,
                   dtype: torch.dtype, k: float = 2.0) -> None:
    """``err(out) <= k * err(out_pt) + 2 * resolution(ref64, out.dtype)``, both errors against
    ``ref64``; no NaN in ``out``. ``dtype``: the one plain PyTorch computed ``out_pt`` in."""
    assert not torch.isnan(out).any(), f"{name}: NaN in the output"
    err, err_pt = max_err(out, ref64), max_err(out_pt, ref64)
    floor = 2 * resolution(ref64, out.dtype)
    bound = k * err_pt + floor
    assert err <= bound, (f"{name}: max error {err:.3g} vs float64, more than {k} x plain PyTorch's "
                          f"{err_pt:.3g} in {dtype} + 2 ulps of {out.dtype} ({floor:.3g}): bound "
                          f"{bound:.3g}")
