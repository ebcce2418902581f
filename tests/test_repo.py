"""What the docs promise: the README's test command is what CI runs, `python -m mla_ops` works,
every file and API name the README, ARCHITECTURE and NOTES cite exists, and benchmarks/results/
holds exactly what its MANIFEST lists."""

import json
import os
import pathlib
import re
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```(?:bash|sh)\n(.*?)\n```", text, flags=re.S | re.M)


def test_ci_runs_the_readme_test_command():
    blocks = [b for b in _readme_commands() if "pytest" in b]
    assert blocks, "README.md names no test command"
    test_cmd = blocks[0].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci, f"CI does not run the README's test command {test_cmd!r}"


def test_readme_run_command_is_the_main_job():
    assert any(b.strip().endswith("python -m mla_ops") for b in _readme_commands())


def _run_main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mla_ops", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def test_main_help_documents_every_option():
    out = _run_main("--help")
    assert out.returncode == 0
    for opt in ("--device", "--interpret", "--only", "--repeats", "--seed"):
        assert opt in out.stdout


def test_main_says_which_kernels_run_and_why():
    out = _run_main("--only", "verify", "--repeats", "1",
                    env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^sm_90 Gluon kernels: ", out.stdout, flags=re.M), out.stdout
    assert re.search(r"^eager launches: ", out.stdout, flags=re.M), out.stdout


def test_main_job_runs_and_checks_both_kernels():
    if torch.cuda.is_available():
        out = _run_main("--repeats", "3")
        assert "Triton kernels" in out.stdout
    else:
        # As the README says it: TRITON_INTERPRET unset, --interpret alone turns it on.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        out = _run_main("--interpret", "--repeats", "1", env=env)
        assert "running: Triton kernels in the interpreter" in out.stdout
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" OK") == 2 and "all checks passed" in out.stdout


DOCS = ("README.md", "ARCHITECTURE.md", "benchmarks/NOTES.md")
RESULTS = ROOT / "benchmarks" / "results"


def _readme_code_spans(docs=DOCS[:2]):
    text = "".join((ROOT / d).read_text() for d in docs)
    return set(re.findall(r"`([^`\n]+)`", text))


def test_every_file_the_docs_name_exists():
    """A path in a code span of the README, ARCHITECTURE or NOTES
    (``benchmarks/results/h200/v8/eager_launch.json``, or relative to the package, the
    benchmarks or the results folder) is a file or folder of the tree; globs match at least
    one."""
    bases = [ROOT, ROOT / "mla_ops", ROOT / "benchmarks", RESULTS, RESULTS / "h200"]
    missing = []
    for span in _readme_code_spans(DOCS):
        words = span.split()
        for before, word in zip([""] + words, words):
            if before in ("--json", ">", "-o"):
                continue  # what a command writes
            if not re.fullmatch(r"[\w./*-]+\.(json|py|md|txt|sh)|[\w.-]+/", word):
                continue  # a file with its extension, or a folder written with its slash
            if word.startswith(("http", "$", ".flashmla", "<")):
                continue
            word = word.rstrip("/")
            found = any(list(b.glob(word)) for b in bases)
            if not found and "/" not in word:  # a bare name: anywhere in the package or results
                found = any(list((ROOT / d).glob("**/" + word))
                            for d in ("mla_ops", "benchmarks/results"))
            if not found:
                missing.append(word)
    assert not missing, f"the docs name files that do not exist: {sorted(set(missing))}"


def test_the_readme_images_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert all((ROOT / i).is_file() for i in images), images


def test_the_launch_tables_cite_committed_results():
    """A table's ``source`` that names a results file names one in the tree."""
    missing = []
    for path in sorted((ROOT / "mla_ops").glob("*/tables/*.json")):
        source = json.loads(path.read_text())["source"]
        for cited in re.findall(r"benchmarks/results/[\w./-]+", source):
            if not (ROOT / cited.rstrip(".")).exists():
                missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, missing


def test_results_are_exactly_what_the_manifest_lists():
    """Every file under benchmarks/results/ is listed in MANIFEST.md (the first column of its
    tables, relative to results/), and every listed file exists."""
    listed = set()
    for line in (RESULTS / "MANIFEST.md").read_text().splitlines():
        if line.startswith("| `"):
            listed |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    present = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*")
               if p.is_file() and p.name != "MANIFEST.md"}
    assert not present - listed, f"not in MANIFEST.md: {sorted(present - listed)}"
    assert not listed - present, f"in MANIFEST.md, not in results/: {sorted(listed - present)}"


def test_every_api_name_the_readme_names_exists():
    """``mla_ops.x.y`` and ``torch.ops.mla.op`` in the docs resolve (an import, then attributes)."""
    import importlib

    import mla_ops  # noqa: F401  (registers torch.ops.mla)

    bad = []
    for span in _readme_code_spans():
        for name in re.findall(r"(?:mla_ops|torch\.ops\.mla)(?:\.[A-Za-z_]\w*)+", span):
            parts = name.split(".")
            if name.startswith("torch.ops.mla"):
                obj, rest = torch.ops.mla, parts[3:]
            else:
                for i in range(len(parts), 0, -1):
                    try:
                        obj, rest = importlib.import_module(".".join(parts[:i])), parts[i:]
                        break
                    except ImportError:
                        continue
            try:
                for attr in rest:
                    obj = getattr(obj, attr)
            except AttributeError:
                bad.append(name)
    assert not bad, f"README/ARCHITECTURE name what does not exist: {sorted(set(bad))}"
