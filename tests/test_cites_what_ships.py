"""The package, the README, the benchmarks and the tests cite only what a user has: the original
sources (papers, datasheets, engine source files) and what ships (docs/reference/). No path into the
developers' private notes folder, and no development-session numbers: the history of the
figures is in docs/accuracy.md."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where the rules hold (docs/ is checked for the notes folder only: docs/accuracy.md keeps the history)
CHECKED = [ROOT / "paraplan", ROOT / "README.md", ROOT / "benchmarks", ROOT / "tests"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".csv", ".toml", ".txt", ".sh"}

# spelled in parts so that this file does not match itself
NOTES_FOLDER = re.compile("|".join([re.escape("shared" + "/reference"), re.escape(".." + "/shared"),
                                    r"hardware_costmodels\." + "md", r"heat_cf_tiling\." + "md",
                                    "reference " + "§"]))
SESSION = re.compile(r"\b[Ss]top" + r"s? \d+\b")


def _files(roots):
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path


def _hits(pattern, roots):
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{i}: {line.strip()[:100]}"
            for path in _files(roots)
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if pattern.search(line)]


def test_nothing_cites_the_private_notes_folder():
    hits = _hits(NOTES_FOLDER, CHECKED + [ROOT / "docs"])
    assert not hits, "cite the original source or docs/reference/ instead:\n" + "\n".join(hits)


def test_no_session_numbers_outside_the_accuracy_history():
    hits = _hits(SESSION, CHECKED)
    assert not hits, "move the history to docs/accuracy.md:\n" + "\n".join(hits)


def test_the_checks_find_what_they_look_for(tmp_path):
    """The patterns match the forms that were there (a test that could not fail would prove nothing)."""
    sample = tmp_path / "sample.py"
    sample.write_text("# see shared" + "/reference" + " §2.5\n# priced since st" + "op 48 (st" + "op 49)\n")
    assert len(_hits(NOTES_FOLDER, [sample])) == 1
    assert len(_hits(SESSION, [sample])) == 1


def test_docs_reference_describes_the_shipped_files():
    text = (ROOT / "docs" / "reference" / "README.md").read_text()
    for shipped in ("published_runs_calibration.csv", "published_runs_calibration_h100.csv", ".recipes.yaml",
                    "korthikanti2022.yaml", "fitted_constants.yaml"):
        assert shipped in text
    data = ROOT / "paraplan" / "calibration" / "data"
    assert {p.name for p in data.glob("*.csv")} == {"published_runs_calibration.csv",
                                                    "published_runs_calibration_h100.csv"}
