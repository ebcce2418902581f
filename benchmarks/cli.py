"""What every benchmark script shares on its command line.

A script starts with::

    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)

Importing this module sets ``TRITON_INTERPRET=1`` when ``--interpret`` is on the command line,
because Triton reads it once, on its first import (torch may import it). Nothing here imports
torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

if "--interpret" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET_HELP = ("CPU smoke run through the Triton interpreter: a tiny shape, fp16, no graphs; "
                  "it exercises the whole code path, its times mean nothing")


def add_common(parser: argparse.ArgumentParser, *, json_help: str = "write the rows (with the "
               "environment) here") -> None:
    """``--json``, ``--seed``, ``--interpret``: every script takes them."""
    parser.add_argument("--json", metavar="PATH", help=json_help)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interpret", action="store_true", help=INTERPRET_HELP)


def add_jobs(parser: argparse.ArgumentParser, default_text: str, *names: str) -> None:
    parser.add_argument("--jobs", *names, type=int, default=None,
                        help="processes compiling the launch variants in parallel before timing "
                        f"(default: {default_text}; 0 compiles in this process)")


def positive(text: str) -> int:
    """An argparse ``type``: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def split_names(parser: argparse.ArgumentParser, values: Sequence[str] | None,
                known: Sequence[str], flag: str = "--shape") -> list[str] | None:
    """Names given as ``A B``, ``A,B`` or ``all``, checked against ``known``."""
    if values is None:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if [n.lower() for n in names] == ["all"]:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"{flag}: unknown {unknown}; choose from {list(known)} or 'all'")
    return names


def pick_device(interpret: bool, prog: str) -> str | None:
    """``"cpu"`` under ``--interpret``, ``"cuda"`` on a GPU, else None after saying why."""
    if interpret:
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    print(f"{prog}: no CUDA/HIP GPU here. Run it on the GPU machine, or pass --interpret for a "
          "tiny CPU smoke run through the Triton interpreter.", file=sys.stderr)
    return None


def start(argv: Sequence[str] | None, parse, prog: str):
    """Every main's prologue: ``(argv, args, device)``, the device None (after saying why)
    when there is no GPU and no ``--interpret``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    return argv, args, pick_device(args.interpret, prog)


def banner(what: str, env: dict, extra: str = "") -> None:
    print(f"{what} on {env.get('gpu') or 'cpu (Triton interpreter)'}, torch {env['torch']}, "
          f"triton {env['triton']}, commit {env.get('commit') or 'unknown'}" + extra, flush=True)


def finish(rows: list[dict], columns: list[str], json_path: str | None, *, command: str,
           env: dict, ceilings: dict | None = None, table: list[dict] | None = None) -> None:
    """Write the JSON (if asked) and print the short table of ``table`` (default ``rows``)."""
    from benchmarks import results

    write_rows(json_path, rows, ceilings, command=command, env=env)
    print()
    results.print_table(rows if table is None else table, columns)


def write_rows(json_path: str | None, rows: list[dict], ceilings: dict | None = None, *,
               command: str, env: dict) -> None:
    """Write the JSON of a run, and say so, when ``--json`` asked for it."""
    from benchmarks import results

    if json_path:
        results.write_json(json_path, rows, ceilings, command=command, env=env)
        print(f"wrote {json_path}")
