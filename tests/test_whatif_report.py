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


def test_output_folder(report, capsys):
    names = {p.name for p in report.iterdir()}
    assert names == {"figures", "data", "points.csv", "report.html", "scenario.yaml"}
    figs = {p.name for p in (report / "figures").iterdir()}
    for name in ("scaling", "breakdown", "memory", "heatmap", "pareto", "cost"):
        assert f"{name}.png" in figs and f"{name}.svg" in figs
        assert (report / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (report / "figures" / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    df = pd.read_csv(report / "points.csv")
    assert list(df["gpus"]) == [8, 16, 32, 64] and list(df["feasible"]) == [False, True, True, True]
    for col in ("sweep_gpus", "tp", "pp", "dp", "step_time_s", "tokens_per_s", "mfu", "mem_total_gib",
                "time_compute_s", "mem_activations_gib", "train_usd"):
        assert col in df
    html = (report / "report.html").read_text()
    assert "http://" not in html and "https://" not in html and "src=\"figures" not in html   # self-contained
    assert html.count("data:image/png;base64,") == 7
    assert "Assumptions" in html and "FLOP convention" in html and "gemm_plateau_efficiency" in html
    assert "Not drawn for this sweep" in html and "Throughput across the sweep" in html


def test_scenario_file_reproduces_the_report(report, tmp_path):
    again = tmp_path / "again"
    assert main(["whatif", "--scenario", str(report / "scenario.yaml"), "--out", str(again), "--quiet"]) == 0
    a, b = pd.read_csv(report / "points.csv"), pd.read_csv(again / "points.csv")
    pd.testing.assert_frame_equal(a.drop(columns=["search_s"]), b.drop(columns=["search_s"]))


def test_progress_bar_on_stderr(tmp_path, capsys):
    assert main(BASE[:-1] + ["--gpus", "16", "--sweep", "hbm=x1,x2", "--no-heatmap", "--out", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert "2/2 points [" in captured.err and "points [" not in captured.out
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
    assert int(check["images-total"]) == 7
    assert check["images-loaded"] == check["images-total"]
    assert check["errors"] == "0", check.get("error-messages")
    assert _console_lines(r.stderr) == []


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
        main(BASE + ["--gpus", "16", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)])
    assert not out.exists() and _siblings(out) == []

    # an existing report survives a failed run, and is replaced whole by a good one
    out.mkdir()
    (out / "old.txt").write_text("previous report")
    with pytest.raises(RuntimeError):
        main(BASE + ["--gpus", "16", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)])
    assert (out / "old.txt").read_text() == "previous report" and _siblings(out) == []
    monkeypatch.undo()
    assert main(BASE + ["--gpus", "16", "--sweep", "hbm=x1", "--no-heatmap", "--out", str(out)]) == 0
    assert not (out / "old.txt").exists() and (out / "report.html").exists() and _siblings(out) == []


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
