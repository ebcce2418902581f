"""What a benchmark leaves behind: the environment record, JSON files and the short table.

Every JSON result is ``{"env", "command", "ceilings", "rows", ...}``: ``env`` says which GPU,
torch, triton, date and git commit measured it, ``command`` how to measure it again.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform as _py_platform
import shlex
import subprocess
from typing import Any, Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent


def git_commit() -> str | None:
    """The commit measured: ``$MLA_OPS_COMMIT`` if set (a copy of the tree without ``.git``,
    such as the device's, cannot say), else this checkout's HEAD with ``+dirty`` when tracked
    files differ from it, else None."""
    if os.environ.get("MLA_OPS_COMMIT"):
        return os.environ["MLA_OPS_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or pathlib.Path(top).resolve() != ROOT:
        return None  # no checkout, or this tree sits inside another repository
    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


def env_info() -> dict[str, Any]:
    """GPU, torch, triton, python, date and commit: carried by every JSON result."""
    import torch
    import triton

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": _py_platform.python_version(),
        "commit": git_commit(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sm_count=props.multi_processor_count,
                    cuda=torch.version.cuda, hip=torch.version.hip)
    else:
        info.update(gpu=None)
    return info


def command_line(script: str, argv: Iterable[str]) -> str:
    """``python benchmarks/<script> <argv>``, quoted for a shell."""
    return shlex.join(["python", f"benchmarks/{script}", *argv])


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` through a temporary file, so that a reader never sees half of it."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | os.PathLike, rows: list[dict], ceilings: dict | None = None, *,
               command: str | None = None, env: dict | None = None, **sections: Any) -> None:
    """``{"env", "command", "ceilings", "rows", **sections}`` as indented JSON."""
    doc = {"env": env or env_info(), "command": command, "ceilings": ceilings, "rows": rows,
           **sections}
    write_text(path, json.dumps(doc, indent=1) + "\n")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A short fixed-width table of ``columns`` from ``rows`` (benchmarks print it last)."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
