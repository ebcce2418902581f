"""Install mla_ops; compile csrc_meta/ into mla_ops/_C when a C++ toolchain and torch are here.

    pip install --no-build-isolation -e .[test]                    # with the C++ library
    MLA_OPS_NO_EXT=1 pip install --no-build-isolation -e .[test]   # pure Python

`--no-build-isolation` builds against the torch already installed: an isolated build
environment would have no torch (or would download one). Nothing here ever requires one:
without torch, without a compiler, or when the compile fails, the install is pure Python and
`import mla_ops` registers the ops with `torch.library.custom_op` instead.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
EXT_NAME = "mla_ops._C"
EXT_SOURCES = ["csrc_meta/mla_meta.cpp"]  # one translation unit keeps the build short


def _say(msg: str) -> None:
    print(f"mla_ops setup: {msg}", file=sys.stderr)


def _version() -> str:
    with open(os.path.join(ROOT, "mla_ops", "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _extension() -> tuple[list, dict]:
    """``(ext_modules, cmdclass)`` for the C++ library, or ``([], {})`` with the reason said."""
    if os.environ.get("MLA_OPS_NO_EXT", "0") not in ("", "0"):
        _say("MLA_OPS_NO_EXT is set: pure-Python install (no mla_ops._C)")
        return [], {}
    try:
        import torch  # noqa: F401  (the installed one; never a build dependency)
        from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths
    except Exception as e:  # no torch in this environment (e.g. an isolated build)
        _say(f"torch is not importable here ({e}): pure-Python install (no mla_ops._C)")
        return [], {}
    cxx = os.environ.get("CXX", "c++").split()[0]
    if shutil.which(cxx) is None:
        _say(f"no C++ compiler ({cxx!r} not found): pure-Python install (no mla_ops._C)")
        return [], {}
    if not any(os.path.exists(os.path.join(p, "torch", "library.h")) for p in include_paths()):
        _say("torch's C++ headers are missing: pure-Python install (no mla_ops._C)")
        return [], {}

    class OptionalBuildExtension(BuildExtension):
        """A failed compile leaves a working pure-Python install instead of failing it."""

        def build_extensions(self):
            try:
                super().build_extensions()
            except Exception as e:  # compiler/ABI errors surface as several exception types
                _say(f"building {EXT_NAME} failed ({e}): pure-Python install (no mla_ops._C)")
                self.extensions = []

        def get_outputs(self):
            return super().get_outputs() if self.extensions else []

    ext = CppExtension(
        EXT_NAME,
        EXT_SOURCES,
        # Shape checks only: optimisation buys nothing and costs build time.
        extra_compile_args={"cxx": ["-O1", "-g0"]},
    )
    return [ext], {"build_ext": OptionalBuildExtension.with_options(use_ninja=False)}


ext_modules, cmdclass = _extension()

setup(
    name="mla_ops",
    version=_version(),
    description="Triton MLA decode-verify and split-head-dim encoder attention, as torch.ops.mla",
    packages=find_packages(include=["mla_ops", "mla_ops.*"]),
    package_data={"mla_ops": ["*/tables/*.json", "tables/*.json"]},
    python_requires=">=3.9",
    install_requires=["torch>=2.6", "triton>=3.2"],
    extras_require={"test": ["pytest", "expecttest", "numpy"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
