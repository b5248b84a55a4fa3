"""The package's layering (issue 13): imports run one way, checked by import-linter's contract in
pyproject.toml; imports inside functions only where they keep torch or matplotlib out."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "paraplan"
MAX_FUNCTION_LOCAL_SHARE = 0.20


def internal_imports() -> list[tuple[str, str, bool]]:
    """(importing module, imported module, inside a function) for every ``paraplan.*`` import."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] != "paraplan":
                    continue
                up, local = node, False
                while up in parents:
                    up = parents[up]
                    if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        local = True
                        break
                rows.append((str(path.relative_to(PACKAGE.parent)), target, local))
    return rows


def test_layers_contract_holds():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is needed (pip install -e '.[test]')")
    r = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout or "broken" not in r.stdout.split("Contracts:")[-1]


def test_function_local_imports_stay_rare():
    rows = internal_imports()
    local = [r for r in rows if r[2]]
    share = len(local) / len(rows)
    assert share <= MAX_FUNCTION_LOCAL_SHARE, (
        f"{len(local)} of {len(rows)} internal imports ({share:.0%}) are inside functions:\n"
        + "\n".join(f"  {src} -> {dst}" for src, dst, _ in local))


def test_light_commands_import_neither_torch_nor_matplotlib():
    code = ("import sys, paraplan.cli, paraplan.costmodels.estimate, paraplan.planner.search, "
            "paraplan.planner.stages, paraplan.planner.export, paraplan.scenario, paraplan.profiles.cluster\n"
            "heavy = sorted(m for m in ('torch', 'matplotlib') if m in sys.modules)\n"
            "assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
