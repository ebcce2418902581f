"""Exact merge of partial attention states by their LSE (decode context parallelism).

``kernels.py`` holds the Triton kernels, ``launch.py`` the public functions and their checks.
"""
