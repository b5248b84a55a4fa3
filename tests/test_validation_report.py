"""``paraplan validate`` end to end (one real torchrun launch) and the report's contents."""
import json

import pytest

from paraplan.cli.validate import main
from paraplan.validation.compare import rel_err

REQUIRED = ("plan", "world_size", "backend", "measured", "predicted", "relative_error",
            "loss_matches_reference")


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    predicted = {"step_time_s": 0.1, "memory_bytes_per_rank": 2_000_000,
                 "time_breakdown_s": {"compute": 0.05, "tp_comm": 0.04, "optimizer": 0.01}}
    (out / "pred.json").write_text(json.dumps(predicted))
    rc = main(["validate", "--nproc-per-node", "2", "--tp", "2", "--sequence-parallel",
               "--micro-batch", "2", "--global-batch", "4", "--steps", "2", "--warmup", "1",
               "--layers", "2", "--predicted", str(out / "pred.json"), "--out", str(out)])
    return rc, out, predicted


def test_validate_writes_complete_report(validated):
    rc, out, predicted = validated
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    for k in REQUIRED:
        assert k in report, k
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    assert report["loss_matches_reference"] is True
    for side in ("measured", "predicted"):
        for k in ("step_time_s", "memory_bytes_per_rank", "time_breakdown_s"):
            assert k in report[side]
    m = report["measured"]
    assert m["step_time_s"] > 0 and m["memory_bytes_per_rank"] > 0
    assert report["relative_error"]["step_time"] == pytest.approx(
        rel_err(predicted["step_time_s"], m["step_time_s"]))
    assert report["relative_error"]["memory"] == pytest.approx(
        rel_err(predicted["memory_bytes_per_rank"], m["memory_bytes_per_rank"]))
    assert (out / "breakdown.png").stat().st_size > 1000
    table = (out / "report.txt").read_text()
    assert "time.tp_comm" in table and "%" in table
    assert not list(out.glob(".tmp-*"))


def test_bad_input_exits_2_with_one_line(capsys, tmp_path):
    rc = main(["validate", "--nproc-per-node", "2", "--tp", "3", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: ") and "Traceback" not in err
