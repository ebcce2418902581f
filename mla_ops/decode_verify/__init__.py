"""Causal MLA decode-verify attention over a paged latent cache.

``kernels.py`` holds the portable Triton kernels and ``gluon_kernels.py`` the sm_90 ones,
``launch.py`` the public functions (checks, launch, warmup) and ``gluon_launch.py`` the Gluon
family's host side, ``splits.py`` the split cap and the chunking every kernel applies,
``plan.py`` the plan-once / run-per-layer API, ``configs.py`` and ``tables/`` the
per-architecture launch tables.
"""
