"""Installed without the torch extra (``pip install -e .``), the commands that need torch end in one
line naming the extra and the command that installs it, exit 2 (issue 67: a 15-line
``ModuleNotFoundError`` traceback before). Run as real processes with torch made unimportable by a
``sitecustomize.py`` on ``PYTHONPATH`` (``sys.modules['torch'] = None``), as a user without torch has it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paraplan.profiles.store import ProfileStore

INSTALL = "pip install 'paraplan[torch]'"


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("notorch")
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    return {**os.environ, "PYTHONPATH": str(site), "PARAPLAN_PROGRESS": "0"}


def _paraplan(env, cwd, *argv):
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", *argv], capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=120)
    return r.returncode, [ln for ln in r.stderr.splitlines() if ln.strip()], r.stderr


@pytest.mark.parametrize("argv, what", [
    (["validate", "--tp", "1", "--out", "{d}/val"], "validate"),
    (["profile", "--quick", "--db", "{d}/p.sqlite"], "profile"),
    (["cf", "validate", "--users", "200", "--items", "300", "--interactions", "2000", "--out", "{d}/cfv"],
     "cf validate"),
    (["cf", "profile", "--out", "{d}/cpu.json"], "cf profile"),
    (["estimate", "--model", "llama3-8b", "--cluster", "local", "--db", "{d}/store.sqlite"], "--cluster local"),
])
def test_commands_that_need_torch_name_the_extra_in_one_line(no_torch_env, tmp_path, argv, what):
    ProfileStore(str(tmp_path / "store.sqlite"))           # a profile database exists (without this machine)
    rc, lines, err = _paraplan(no_torch_env, tmp_path, *[a.replace("{d}", str(tmp_path)) for a in argv])
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("paraplan: error: ") and what in lines[0]
    assert "torch" in lines[0] and INSTALL in lines[0] and "pip install -e '.[torch]'" in lines[0], lines[0]
    assert not (tmp_path / "val").exists() and not (tmp_path / "cfv").exists()     # nothing half-made


def test_bad_validate_flags_are_named_before_the_missing_extra(no_torch_env, tmp_path):
    """A flag error is still the flag's (the argument checks need no torch)."""
    rc, lines, err = _paraplan(no_torch_env, tmp_path, "validate", "--nproc-per-node", "3", "--tp", "2",
                               "--out", str(tmp_path / "v"))
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("paraplan: error: --nproc-per-node"), err[-2000:]


def test_an_unchecked_import_of_an_extra_is_one_line_too(monkeypatch, capsys, tmp_path):
    """The net under the commands' own checks: any command that imports torch without torch installed
    ends in the same line; an ImportError of anything else (a bug) is not hidden."""
    from paraplan.cli import main, score

    def needs_torch(args):
        import torch  # noqa: F401
        return 0

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(score, "cmd_score", needs_torch)
    assert main(["score", str(tmp_path / "runs.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paraplan: error: paraplan score needs torch") and INSTALL in err

    def broken(args):
        import paraplan_no_such_module  # noqa: F401
    monkeypatch.setattr(score, "cmd_score", broken)
    with pytest.raises(ImportError):
        main(["score", str(tmp_path / "runs.csv")])
