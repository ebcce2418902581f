"""Benchmarks of mla_ops: thin scripts over a few shared modules.

Scripts: ``benchmark_decode_verify.py`` (M1–M7 or a grid), ``ab_decode_verify.py`` (launch
variants in one process), ``sweep_decode_verify.py`` (writes the decode table),
``benchmark_vit_prefill_attn.py`` (P1–P8, C7, C8; ``--sweep`` writes the encoder table),
``ab_prefill.py`` (encoder launch variants in one process, eager or graph, host time),
``vit_towers_e2e.py``, ``benchmark_cp_verify.py`` (context parallelism over ranks),
``serving_step_e2e.py`` (a verify serving step), ``summarize_ab.py`` (the short form of an A/B
file); ``h200_session.sh`` runs them on the H200. Modules: ``shapes`` (named
shapes, anchors, roofline), ``harness`` (timing, ceilings), ``compile_pool``, ``results`` (JSON,
tables), ``cli``, ``decode`` / ``decode_sweep`` / ``prefill`` (per kernel). ``results/`` holds
the results the docs cite (``results/MANIFEST.md``).
"""
