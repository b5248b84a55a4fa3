"""``paraplan whatif`` end to end: the output folder, the HTML report in headless Chromium, atomic writes.

The browser tests need headless Chromium (Debian's ``chromium``). Without it they are skipped with
the reason and the install command, so the README's test command passes on a fresh machine; CI
(``.ci/run``) installs Chromium and sets ``PARAPLAN_REQUIRE_BROWSER=1``, under which a missing
browser fails the tests instead of skipping them.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

from paraplan.cli import main

BASE = ["whatif", "--model", "llama3-70b", "--cluster", "dgx-h100", "--seq-len", "4096", "--global-batch", "128",
        "--quiet"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("whatif") / "report"
    rc = main(BASE + ["--sweep", "gpus=8..64", "--no-offload", "--price-per-gpu-hour", "2.5",
                      "--train-tokens", "1e12", "--out", str(out)])
    assert rc == 0
    return out


@pytest.mark.slow
def test_output_folder(report, capsys):
    names = {p.name for p in report.iterdir()}
    assert names == {"figures", "data", "points.csv", "report.html", "scenario.yaml", ".paraplan"}
    # each entry is a fixed link through .paraplan/current to one complete generation
    gens = [p.name for p in (report / ".paraplan").iterdir() if p.name.startswith("gen-")]
    assert gens == [os.readlink(report / ".paraplan" / "current")]
    for name in names - {".paraplan"}:
        assert os.readlink(report / name) == f".paraplan/current/{name}"
    figs = {p.name for p in (report / "figures").iterdir()}
    for name in ("scaling", "breakdown", "timeline", "memory", "heatmap", "pareto", "cost"):
        assert f"{name}.png" in figs and f"{name}.svg" in figs
        assert (report / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (report / "figures" / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    df = pd.read_csv(report / "points.csv")
    # 16 GPUs fit: with the full memory share (the default since issue 64) and the engine switches searched
    # (bf16 gradients, TP overlap) Megatron-LM's best fits; at the 0.95 margin without them it did not
    assert list(df["gpus"]) == [8, 16, 32, 64] and list(df["feasible"]) == [False, True, True, True]
    for col in ("sweep_gpus", "tp", "pp", "dp", "step_time_s", "tokens_per_s", "mfu", "mem_total_gib",
                "time_compute_s", "mem_activations_gib", "train_usd"):
        assert col in df
    html = (report / "report.html").read_text()
    assert "http://" not in html and "https://" not in html and "src=\"figures" not in html   # self-contained
    assert html.count("data:image/png;base64,") == 8       # the seven figures drawn and the efficiency curves
    assert 'id="fig-timeline"' in html and "estimate --trace" in html
    timeline = pd.read_csv(report / "data" / "timeline.csv")
    fastest = df.loc[df["tokens_per_s"].idxmax()]
    assert (timeline["start_s"] + timeline["dur_s"]).max() == pytest.approx(fastest["step_time_s"], rel=1e-9)
    assert "Assumptions" in html and "FLOP convention" in html and "gemm_plateau_efficiency" in html
    assert "Not drawn for this sweep" in html and "Throughput across the sweep" in html


@pytest.mark.slow
def test_scenario_file_reproduces_the_report(report, tmp_path):
    again = tmp_path / "again"
    assert main(["whatif", "--scenario", str(report / "scenario.yaml"), "--out", str(again), "--quiet"]) == 0
    a, b = pd.read_csv(report / "points.csv"), pd.read_csv(again / "points.csv")
    pd.testing.assert_frame_equal(a, b)
    assert "search_s" not in a and (report / "points.csv").read_bytes() == (again / "points.csv").read_bytes()


@pytest.mark.slow
def test_progress_bar_on_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARAPLAN_PROGRESS", "1")       # bars off a terminal too (paraplan.progress)
    assert main(BASE[:-1] + ["--gpus", "16", "--sweep", "hbm=x1,x2", "--no-heatmap", "--out", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert "what-if: 100%" in captured.err and "2/2" in captured.err and "what-if" not in captured.out
    assert re.search(r"paraplan whatif: 2 points in [0-9.]+ s", captured.err)    # timing on stderr only
    assert not re.search(r"[0-9] s\b", captured.out.splitlines()[0])
    assert "skipped heatmap: turned off" in captured.out


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        why = ("no headless Chromium on PATH (looked for chromium, chromium-browser): the HTML report "
               "is not opened in a browser; apt-get install -y chromium to run this test")
        if os.environ.get("PARAPLAN_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " (PARAPLAN_REQUIRE_BROWSER=1 is set, as in .ci/run)")
        pytest.skip(why)
    return exe


def _browser(exe, *args, url):
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _check(dom: str) -> dict:
    tag = re.search(r'<div id="report-check"([^>]*)>', dom)
    assert tag, "no report-check element in the dumped DOM"
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag.group(1)))


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.slow
@pytest.mark.browser
def test_report_opens_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    url = (report / "report.html").as_uri()
    shot = tmp_path / "report-screenshot.png"
    r = _browser(exe, f"--screenshot={shot}", "--window-size=1280,2400", url=url)
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000 and shot.read_bytes()[:4] == b"\x89PNG"
    r = _browser(exe, "--dump-dom", url=url)
    assert r.returncode == 0, r.stderr[-2000:]
    check = _check(r.stdout)
    assert check["status"] == "done"
    assert int(check["images-total"]) == 8
    assert check["images-loaded"] == check["images-total"]
    assert check["errors"] == "0", check.get("error-messages")
    assert _console_lines(r.stderr) == []


@pytest.mark.slow
@pytest.mark.browser
def test_browser_check_catches_broken_images_and_errors(report, tmp_path):
    """The check is not vacuous: a broken image and a script error are both seen."""
    exe = _chromium()
    html = (report / "report.html").read_text()
    bad = html.replace("</body>", '<img src="data:image/png;base64,AAAA"><script>undefinedFunction()</script></body>')
    page = tmp_path / "broken.html"
    page.write_text(bad)
    r = _browser(exe, "--dump-dom", url=page.as_uri())
    check = _check(r.stdout)
    assert int(check["images-loaded"]) == int(check["images-total"]) - 1
    assert int(check["errors"]) >= 1 and "undefinedFunction" in check["error-messages"]
    assert _console_lines(r.stderr)


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name and path.name in p.name)


@pytest.mark.slow
def test_failed_run_leaves_no_partial_folder(tmp_path, monkeypatch, capsys):
    out = tmp_path / "rep"
    # a bad point fails before anything is written
    assert main(BASE + ["--sweep", "gpus=8,12", "--out", str(out)]) == 2
    assert "gpus=12" in capsys.readouterr().err
    assert not out.exists() and _siblings(out) == []

    # a failure while writing (after the figures are on disk) removes the temporary folder
    import paraplan.reports.report as R  # where write_report looks render_html up

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(R, "render_html", boom)
    with pytest.raises(RuntimeError):
        main(BASE + ["--gpus", "32", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)])
    assert not out.exists() and _siblings(out) == []

    # the user's files in the folder survive a failed run and a good one; the report is added whole
    out.mkdir()
    (out / "old.txt").write_text("the user's notes")
    with pytest.raises(RuntimeError):
        main(BASE + ["--gpus", "32", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"] and _siblings(out) == []
    monkeypatch.undo()
    assert main(BASE + ["--gpus", "32", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)]) == 0
    assert (out / "old.txt").read_text() == "the user's notes" and (out / "report.html").exists()
    assert _siblings(out) == []
    first = (out / "points.csv").read_bytes()

    # a failed re-run leaves the previous report exactly as it was
    monkeypatch.setattr(R, "render_html", boom)
    with pytest.raises(RuntimeError):
        main(BASE + ["--gpus", "16", "--sweep", "hbm=x1,x2", "--no-heatmap", "--out", str(out)])
    monkeypatch.undo()
    assert (out / "points.csv").read_bytes() == first and (out / "old.txt").exists()
    assert len([p for p in (out / ".paraplan").iterdir() if p.name.startswith("gen-")]) == 1


def test_out_entries_not_written_by_paraplan_are_refused(tmp_path, capsys):
    """A folder where a report name is taken by something else (the user's data/ folder, a report of
    an older paraplan) is refused before the sweep runs, and nothing in it changes."""
    out = tmp_path / "proj"
    (out / "data").mkdir(parents=True)
    (out / "data" / "mine.csv").write_text("a,b\n1,2\n")
    assert main(BASE + ["--gpus", "16", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --out") and "data" in err and err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["data"] and (out / "data" / "mine.csv").exists()


@pytest.mark.parametrize("argv, words", [
    (["--sweep", "gpus=abc"], "--sweep gpus"),
    (["--sweep", "warp=1"], "unknown variable"),
    (["--sweep", "offload=gpu"], "--sweep offload"),
    ([], "--sweep"),
    (["--sweep", "gpus=8", "--sweep", "seq_len=1k", "--sweep", "hbm=x2"], "one or two sweeps"),
    (["--sweep", "gpus=8", "--fix", "tp"], "--fix"),
])
def test_cli_errors_are_one_line(argv, words, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(BASE + argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error:") and words in err and "Traceback" not in err
    assert not out.exists()


def test_heading_names_every_swept_cluster():
    from types import SimpleNamespace

    from paraplan.reports.html import clusters_text
    from paraplan.reports.sweep import Scenario, parse_sweep
    swept = Scenario(model="llama3-70b", cluster="dgx-h100", gpus=64,
                     sweeps=(parse_sweep("cluster=dgx-h100,dgx-h200"), parse_sweep("seq_len=4k,8k")))
    assert clusters_text(swept) == "dgx-h100, dgx-h200"
    assert clusters_text(SimpleNamespace(cluster="dgx-h100", sweeps=(parse_sweep("gpus=8,16"),))) == "dgx-h100"


@pytest.mark.slow
def test_a_plan_file_alone_names_the_scenario_it_was_planned_for(tmp_path, capsys):
    """`whatif --plan FILE --sweep ...` takes model, cluster, sequence and batch from the plan file (as
    `estimate --plan FILE` does) and re-estimates that plan at every point; a flag still overrides the file."""
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
                 "--global-batch", "64", "--out", str(plan)]) == 0
    capsys.readouterr()
    out = tmp_path / "report"
    assert main(["whatif", "--plan", str(plan), "--sweep", "gpus=8,16", "--seq-len", "2048", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "llama3-8b" in text
    points = pd.read_csv(out / "points.csv")
    assert list(points.gpus) == [8, 16] and set(points.seq_len) == {2048}
    assert (out / "scenario.yaml").read_text().count("dgx-h100") >= 1


def test_whatif_without_model_or_plan_names_the_flag(tmp_path, capsys):
    assert main(["whatif", "--cluster", "dgx-h100", "--sweep", "gpus=8,16", "--out", str(tmp_path / "r")]) == 2
    assert "--model: required (or --scenario FILE.yaml, or --plan FILE that names it)" in capsys.readouterr().err
