"""Build mla_ops; compile csrc_meta/ into mla_ops/_C when torch and a C++ compiler are here.

    pip install --no-build-isolation -e '.[test]'                    # with the C++ library
    MLA_OPS_NO_EXT=1 pip install --no-build-isolation -e '.[test]'   # pure Python

``--no-build-isolation`` builds against the torch already installed: an isolated build
environment has no torch, so it would build no ``_C`` (it never downloads one: torch is not a
build requirement). Without torch, without a compiler, or when the compile fails, the install
is pure Python and ``import mla_ops`` registers the ops with ``torch.library.custom_op``.
Either way the build says which in one line (``mla_ops setup: ...``, shown by ``pip -v``) and
records it in ``mla_ops/_C.status``, which ``python -m mla_ops`` and the test header print.

The C++ Meta kernels are generated from ``mla_ops/spec.py`` (the one argument spec of every
op) into the build tree; nothing generated is committed.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig

from setuptools import Command, Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
EXT_NAME = "mla_ops._C"
STATUS = "_C.status"


def _say(msg: str) -> None:
    print(f"mla_ops setup: {msg}", file=sys.stderr, flush=True)


def _why_not_build() -> str | None:
    """None when the C++ library can be built here, else the reason it is not."""
    if os.environ.get("MLA_OPS_NO_EXT", "0") not in ("", "0"):
        return "MLA_OPS_NO_EXT is set"
    try:
        from torch.utils.cpp_extension import include_paths
    except Exception as e:  # e.g. an isolated build environment: no torch
        return (f"torch is not importable here ({type(e).__name__}: {e}); build with "
                "--no-build-isolation next to an installed torch")
    cxx = os.environ.get("CXX", "c++").split()[0]
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not found)"
    if not any(os.path.exists(os.path.join(p, "torch", "library.h")) for p in include_paths()):
        return "torch's C++ headers are missing"
    return None


class BuildC(build_ext):
    """Builds ``_C`` when it can; otherwise, or when the compile fails, a pure-Python install.
    Says which, once, and records it next to where ``_C`` goes."""

    def run(self):
        why = _why_not_build()
        if why is None:
            try:
                self._build_with_torch()
                self._record(f"built {EXT_NAME} ({self.get_ext_fullpath(EXT_NAME)})")
                return
            except Exception as e:  # compiler/ABI errors surface as several exception types
                why = f"building {EXT_NAME} failed ({type(e).__name__}: {e})"
        self._record(f"pure-Python install (no {EXT_NAME}): {why}")

    def _build_with_torch(self):
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        generated = os.path.join(os.path.abspath(self.build_temp), "generated")
        os.makedirs(generated, exist_ok=True)
        inc = os.path.join(generated, "mla_spec_generated.inc")
        # By path: importing the mla_ops package needs torch and triton.
        text = runpy.run_path(os.path.join(ROOT, "mla_ops", "spec.py"))["cpp_source"]()
        if not os.path.exists(inc) or open(inc).read() != text:  # a changed spec rebuilds _C
            with open(inc, "w") as f:
                f.write(text)
        ext = CppExtension(EXT_NAME, ["csrc_meta/mla_meta.cpp", "csrc_meta/mla_replay.cpp"],
                           include_dirs=[generated],
                           depends=[inc],
                           # Shape checks and the replay's key and memcpy: -O1 is enough.
                           extra_compile_args={"cxx": ["-O1", "-g0", "-std=c++17"]})
        # The real extension replaces the placeholder for the builder, which takes this
        # command's options (build dirs, --inplace / editable mode).
        self.distribution.ext_modules = [ext]
        builder = BuildExtension.with_options(use_ninja=False)(self.distribution)
        for opt in ("build_lib", "build_temp", "inplace", "editable_mode", "force", "compiler",
                    "debug"):
            setattr(builder, opt, getattr(self, opt))
        builder.ensure_finalized()
        builder.run()
        self._outputs = builder.get_outputs()

    def _record(self, line: str) -> None:
        _say(line)
        path = os.path.join(os.path.dirname(self.get_ext_fullpath(EXT_NAME)), STATUS)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(line + "\n")
        self._outputs = getattr(self, "_outputs", []) + [path]

    def get_outputs(self):
        return list(getattr(self, "_outputs", []))


class Develop(Command):
    """``setup.py develop``: what pip before 21.3 runs for ``pip install -e .`` (it has no PEP 660
    editable builds). setuptools >= 80 turns it into a nested ``pip install -e .
    --use-pep517``, which such a pip cannot do, and which would build in isolation (no torch, no
    ``_C``). So, as pip >= 21.3 does through ``build_editable``: metadata, ``_C`` built in
    place, and the source tree put on the path."""

    description = "editable install for pips older than 21.3"
    user_options = [("no-deps", "N", "ignored: pip installs the dependencies"),
                    ("install-dir=", "d", "where the .pth file goes (default: site-packages)"),
                    ("user", None, "ignored"), ("prefix=", None, "ignored")]
    boolean_options = ["no-deps", "user"]

    def initialize_options(self):
        self.no_deps = self.install_dir = self.user = self.prefix = None

    def finalize_options(self):
        pass

    def run(self):
        self.run_command("egg_info")  # the metadata pip reads back (mla_ops.egg-info)
        self.reinitialize_command("build_ext", inplace=1)
        self.run_command("build_ext")
        site = self.install_dir or sysconfig.get_paths()["purelib"]
        with open(os.path.join(site, "mla_ops-editable.pth"), "w") as f:
            f.write(ROOT + "\n")
        _say(f"editable install through setup.py develop (a pip older than 21.3): {ROOT} is on "
             f"the path of {site}")


setup(
    # The swept tables' folders (data, no __init__.py) are packages too, so that setuptools
    # ships their JSON without warning about package data outside any package.
    packages=find_namespace_packages(include=["mla_ops", "mla_ops.*"], exclude=["*__pycache__*"]),
    # A flat layout rooted here: an editable install is then a plain .pth of this folder
    # (setuptools' meta-path finder, for other layouts, warns on every install).
    package_dir={"": "."},
    package_data={"": ["*.json"]},
    # A placeholder the BuildC command builds with torch's extension tooling (or skips, saying
    # why): setuptools runs build_ext only for a distribution with extension modules.
    ext_modules=[Extension(EXT_NAME, sources=[])],
    cmdclass={"build_ext": BuildC, "develop": Develop},
    zip_safe=False,
)
