"""Causal MLA decode-verify attention over a paged latent cache (SPEC.md §1).

``kernels.py`` holds the Triton kernels, ``launch.py`` the public functions (checks, split
helpers, launch, warmup), ``configs.py`` the per-architecture launch tables.
"""
