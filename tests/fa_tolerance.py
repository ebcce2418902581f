"""Flash-attention's accuracy rule, shared by the context-parallel tests.

A kernel's error against a float64 reference may be at most ``k`` times the error plain PyTorch
makes computing the same thing in the test's dtype, plus the rounding noise of that dtype at the
result's magnitude (``(ref + 0.3 - 0.3 - ref)`` rounded in the dtype, as flash-attention's tests
take it). A fixed atol would pass a kernel that is wrong by less than it; this scales with what
the dtype can do.
"""

from __future__ import annotations

import torch


def rounding_noise(ref64: torch.Tensor, dtype: torch.dtype) -> float:
    r = ref64[torch.isfinite(ref64)].to(dtype)
    if r.numel() == 0:
        return 0.0
    return float(((r + 0.3 - 0.3) - r).abs().max())


def max_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    """Max |x - ref| over the entries where ref is finite (the -inf pattern is checked apart)."""
    finite = torch.isfinite(ref64)
    if not finite.any():
        return 0.0
    return float((x.double()[finite] - ref64[finite]).abs().max())


def assert_fa_rule(name: str, out: torch.Tensor, ref64: torch.Tensor, out_pt: torch.Tensor,
                   dtype: torch.dtype, k: float = 2.0) -> None:
    """``err(out) <= k * err(out_pt) + noise``, both against ``ref64``; no NaN in ``out``."""
    assert not torch.isnan(out).any(), f"{name}: NaN in the output"
    err, err_pt = max_err(out, ref64), max_err(out_pt, ref64)
    bound = k * err_pt + 2 * rounding_noise(ref64, dtype)
    assert err <= bound, (f"{name}: max error {err:.3g} vs float64, more than {k} x plain PyTorch's "
                          f"{err_pt:.3g} in {dtype} (+ noise): bound {bound:.3g}")
