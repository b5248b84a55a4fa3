"""Bad input never ends in a traceback, a hang or an error that does not say which field.

A fixed-seed sample of the fuzz cases of ``benchmarks/fuzz_cli.py`` (hostile flag values, mistyped
flags and choices, broken model / Hugging Face / cluster / plan / scenario / CPU-profile files and
profile databases, over plan, estimate, export, whatif, list, cf plan and the argument checks of
validate and profile) runs in-process and a few as real processes; then the issue's cases one by one.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import ConfigError
from paraplan.planner.space import divisors, prime_factors
from paraplan.workloads.presets import load_model

_spec = importlib.util.spec_from_file_location("fuzz_cli", Path(__file__).parents[2] / "benchmarks" / "fuzz_cli.py")
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_cli"] = fuzz
_spec.loader.exec_module(fuzz)


@pytest.mark.slow
def test_fuzzed_cli_inputs_end_cleanly_and_name_their_field(monkeypatch):
    monkeypatch.setenv("PARAPLAN_PROGRESS", "0")
    cases = fuzz.make_cases(300, seed=20261123, subprocess_every=50)   # every 50th case a real process can take
    results = [fuzz.run_case(c) for c in cases]
    bad = [(r.verdict, r.case.cause, " ".join(r.case.argv)[:200], r.output[-600:]) for r in results
           if r.verdict != "ok"]
    assert not bad, bad[:5]
    s = fuzz.summarize(results)
    assert s["tracebacks"] == s["hangs"] == s["errors_not_naming_field"] == 0
    assert s["subprocess_cases"] >= 3
    assert max(r.cpu_seconds for r in results) < fuzz.HANG_S and max(r.seconds for r in results) < fuzz.WALL_LIMIT_S
    # the sample exercises both outcomes, and every command
    assert s["exit_codes"].get("2", 0) > 100 and s["exit_codes"].get("0", 0) > 10
    assert {c.argv[0] for c in cases} >= {"plan", "estimate", "export", "whatif", "list", "cf", "validate", "profile"}


def test_the_judge_catches_what_it_looks_for():
    """The fuzz's verdicts are not vacuous: a traceback, a hang, an error naming another field and
    a warning spill are each caught."""
    case = fuzz.Case("x", ["plan"], fields=("--gpus",))
    assert fuzz.judge(case, 1, "Traceback (most recent call last):\n  ...", 0.1) == "traceback"
    assert fuzz.judge(case, None, "", 20.5) == "hang"
    assert fuzz.judge(case, 2, "paraplan plan: error: --top: must be positive\n", 0.1) == "unnamed"
    assert fuzz.judge(case, 2, "x.py:3: RuntimeWarning: overflow\nparaplan: error: --gpus: bad\n", 0.1) == "warning"
    assert fuzz.judge(case, 2, "paraplan plan: error: --gpus must be a positive integer, got '0'\n", 0.1) == "ok"
    assert fuzz.judge(case, 2, "paraplan plan: error: --gpus: bad\n(see: paraplan plan --help)\n", 0.1) == "ok"
    assert fuzz.judge(case, 2, "paraplan: error: --gpus: a name with\na newline\n", 0.1) == "multiline"
    # an error about another spelling of a flag names the flag it stands for (validate --virtual-stages +5)
    alias = fuzz.Case("x", ["validate"], fields=fuzz._flag_names("--virtual-stages"))
    assert fuzz.judge(alias, 2, "paraplan: error: --vpp: 5 virtual stages per pipeline stage need --pp > 1\n", 0.1) == "ok"


def test_parts_of_a_run_are_the_whole_run():
    """``--part K/N`` slices the one case list (no case lost or run twice), and ``--add`` adds the parts'
    summaries: counts summed, the slowest case kept, and whether the parts make up the whole run."""
    n = 1001
    bounds = [fuzz._part(f"{k}/3", n) for k in (1, 2, 3)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    with pytest.raises(ValueError, match="K/N"):
        fuzz._part("4/3", n)

    def part(lo, hi, slow, codes, causes):
        return {"cases": hi - lo, "subprocess_cases": 1, "tracebacks": causes.get("traceback: x", 0), "hangs": 0,
                "errors_not_naming_field": 0, "errors_over_one_line": 0, "warning_spills": 0, "other_exit_codes": 0,
                "seconds": 10.0, "exit_codes": codes, "slowest_case_cpu_s": slow, "slowest_case": f"case {slow}",
                "slowest_case_wall_s": slow * 2, "by_cause": causes, "range": [lo, hi]}
    s = fuzz.add_summaries([part(0, 6, 1.5, {"0": 2, "2": 4}, {}), part(6, 10, 3.0, {"2": 3, "1": 1}, {"traceback: x": 1})])
    assert (s["cases"], s["tracebacks"], s["seconds"], s["exit_codes"]) == (10, 1, 20.0, {"2": 7, "0": 2, "1": 1})
    assert (s["slowest_case"], s["slowest_case_wall_s"], s["whole"]) == ("case 3.0", 6.0, True)
    assert not fuzz.add_summaries([part(6, 10, 3.0, {"2": 4}, {})])["whole"]


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return rc, out, lines


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--top", "2147483648"], "--top must be at most 1,000"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "9" * 5000], "--gpus must be a positive"),
    (["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--oversubscription", "nan"], "--oversubscription"),
    (["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--vpp", "2"], "--vpp: 2 virtual stages"),
    (["whatif", "--model", "llama3-8b", "--cluster", "dgx-h100", "--sweep", "gpus=8", "--out", "r",
      "--price-per-gpu-hour", "0"], "--price-per-gpu-hour must be a finite number >= 1e-08"),
    (["validate", "--tp", "0", "--out", "v"], "--tp must be a positive integer"),
    (["validate", "--nproc-per-node", "0", "--out", "v"], "--nproc-per-node must be a positive integer"),
    (["validate", "--timeout", "0", "--out", "v"], "--timeout must be a finite number > 0"),
    (["validate", "--timeout", "-5", "--out", "v"], "--timeout"),
    (["validate", "--timeout", "nan", "--out", "v"], "--timeout must be a finite number"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--fix", "tp=0"], "--fix tp: must be a positive"),
    (["plan", "--modle", "llama3-8b"], "--modle: unrecognized argument; did you mean --model?"),
    # a positional value that starts with '-' is read by argparse as a flag: name the positional it was meant for
    (["score", "-1e309", "--format", "json"], "-1e309: read as a flag because it starts with '-', not as RUNS.csv"),
    (["score", "-inf"], "-inf: read as a flag because it starts with '-', not as RUNS.csv"),   # fuzz_cli, 10,000 cases
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--fromat", "json"], "did you mean --format"),
    # estimate's --pp given to plan: no did-you-mean of the flag itself, the way plan pins an axis
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--pp", "0"],
     "--pp: not a flag of this command; the search pins an axis with --fix AXIS=VALUE"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--format", "jsno"], "did you mean json?"),
    # one command's spelling given to another: the spelling this command uses, not --fix or a near miss
    # validate takes the shared plan flags (--sp) and its earlier spelling (--sequence-parallel) alike
    (["validate", "--tp", "2", "--sp", "--nproc-per-node", "2"], "--out: required"),
    (["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--sequence-parallel"],
     "--sequence-parallel: not a flag of this command; estimate spells it --sp"),
    (["whatif", "--virtual-stages", "2"], "this command spells it --vpp"),
    (["lst", "models"], "command: unknown value 'lst'; did you mean list?"),
    (["estimate", "--model", "llama3-8b", "--cluster", "x" * 300], "cluster: unknown name"),
    (["estimate", "--model", "m" * 300 + ".yaml", "--cluster", "dgx-h100"], "model: no such file"),
])
def test_issue_inputs_get_one_line_naming_the_flag(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    rc, out, lines = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert time.perf_counter() - t0 < 20
    errors = [ln for ln in lines if ": error: " in ln]
    assert len(lines) <= 2 and len(errors) == 1 and needle in errors[0], lines
    assert not any("Warning" in ln or "Traceback" in ln for ln in lines)
    assert len(errors[0]) < 400          # a 5000-digit value is not echoed whole


def test_validate_argument_checks_name_flags_before_torch(tmp_path):
    from paraplan.cli import build_parser
    from paraplan.cli.validate import check_validate_args
    ap = build_parser()
    for argv, field in ((["--nproc-per-node", "3", "--tp", "2"], "--nproc-per-node"),
                        (["--hidden", "30", "--heads", "4"], "--hidden"),
                        (["--virtual-stages", "2"], "--vpp"),   # validate's earlier spelling of --vpp
                        (["--nnodes", "2", "--node-rank", "2"], "--node-rank"),
                        (["--nnodes", "2"], "--rdzv-endpoint")):
        with pytest.raises(ConfigError) as e:
            check_validate_args(ap.parse_args(["validate", *argv, "--out", str(tmp_path / "v")]))
        assert e.value.field == field
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_validate_args(ap.parse_args(["validate", "--out", str(tmp_path / "f")]))


@pytest.mark.parametrize("out, needle", [
    ("{d}", "is a folder"), ("{d}/file/x.json", "is a file, so"), ("{d}/" + "n" * 300, "bytes long"),
    ("/proc/paraplan-test/x.json", "cannot write")])
def test_unwritable_out_is_named(capsys, tmp_path, out, needle):
    (tmp_path / "file").write_text("x")
    rc, _, lines = _run(capsys, "plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--top", "1",
                        "--no-stage-ilp", "--format", "csv", "--out", out.replace("{d}", str(tmp_path)))
    errors = [ln for ln in lines if ": error: " in ln]
    assert rc == 2 and len(errors) == 1 and "--out" in errors[0] and needle in errors[0], lines


@pytest.mark.parametrize("text, needle", [
    ('{"hidden_size": ' + "1" * 5000 + "}", "more than 4300 digits"),
    ("[" * 100000 + "]" * 100000, "nested more than"),
    (b"\xff\xfe{}", "not UTF-8"),
    ('{"hidden_size": NaN, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 8}', "hidden_size"),
    ('{"hidden_size": 64, "num_hidden_layers": 2.5, "num_attention_heads": 2, "vocab_size": 8}',
     "num_hidden_layers"),
    ('{"n_embd": 64, "n_layer": 2, "n_head": 3, "vocab_size": 8}', "n_embd"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, '
     '"vocab_size": 8}', "num_key_value_heads"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8, '
     '"max_position_embeddings": "abc"}', "max_position_embeddings"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8, '
     '"model_type": ["llama"]}', "model_type"),
])
def test_bad_config_json_names_the_files_key(tmp_path, text, needle):
    f = tmp_path / "config.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert needle in str(e.value) and len(str(e.value)) < 400


def test_gpt2_style_hugging_face_config_is_read(tmp_path):
    """GPT-2's config.json (n_embd, n_layer, n_head, n_positions, activation_function, tied head):
    124.4 M parameters, as Hugging Face counts GPT-2 small."""
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024,
           "vocab_size": 50257, "activation_function": "gelu_new", "n_inner": None, "layer_norm_epsilon": 1e-5}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    m = load_model(str(f))
    assert (m.layers, m.hidden, m.heads, m.ffn_hidden, m.activation) == (12, 768, 12, 3072, "gelu")
    assert m.tied_embeddings and m.learned_positions and m.max_positions == 1024
    assert m.num_params == pytest.approx(124.4e6, rel=0.01)


def test_divisors_factorize_instead_of_walking():
    assert all(divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 600))
    t0 = time.perf_counter()
    assert divisors(2**31) == [2**k for k in range(32)]
    assert divisors(2**31 - 1) == [1, 2**31 - 1]          # a Mersenne prime: the slowest trial division
    assert prime_factors(3072 * 1000) == {2: 13, 3: 1, 5: 3}
    assert time.perf_counter() - t0 < 1.0


def test_profile_db_that_is_not_one_is_named(capsys, tmp_path):
    db = tmp_path / "p.sqlite"
    db.write_text("not a database\n" * 50)
    rc, _, lines = _run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "profile:somehost", "--db", str(db))
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("paraplan: error: --db") and "not an SQLite database" in lines[0]


def test_a_few_real_processes(tmp_path):
    """The installed entry point, not just main(): an argparse error and a bad file, one or two lines each."""
    bad = tmp_path / "m.yaml"
    bad.write_bytes(b"layers: \xff\n")
    for argv, needle in ((["plan", "--gpsu", "8"], "did you mean --gpus"),
                         (["estimate", "--model", str(bad), "--cluster", "dgx-h100"], "not UTF-8")):
        r = subprocess.run([sys.executable, "-m", "paraplan.cli", *argv], capture_output=True, text=True, timeout=60)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and "Traceback" not in r.stderr and 1 <= len(lines) <= 2 and needle in lines[0], lines


def test_denormal_price_is_refused_not_a_warning_spill(capsys):
    """--price-per-gpu-hour 1e-320 (a denormal) once overflowed the cost axis's inverse into numpy
    warnings (found by the 10,000-case fuzz run); it is now below the accepted range."""
    from paraplan.cli import main
    rc = main(["whatif", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--sweep", "gpus=8,16",
               "--price-per-gpu-hour", "1e-320", "--out", "unused-report"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("paraplan whatif: error: --price-per-gpu-hour") and "Warning" not in err


def test_a_path_whose_bytes_are_not_utf8_is_echoed_escaped(tmp_path):
    """``whatif --out $'\\x80'`` (found by the 10,000-case fuzz run): the report was written, then the
    ``wrote ...`` line raised UnicodeEncodeError on a strict UTF-8 stdout (en_US.UTF-8; Python reads the
    byte as '\\udc80'), a traceback after the work was done. Now it prints the byte escaped, and in-process
    callers get their strict stream back afterwards."""
    import io

    r = subprocess.run([sys.executable, "-m", "paraplan.cli", "whatif", "--model", "llama3-8b", "--cluster",
                        "dgx-h100", "--gpus", "8", "--sweep", "gpus=8,16", "--no-heatmap", "--quiet", "--out", b"\x80"],
                       capture_output=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PARAPLAN_PROGRESS": "0"})
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-800:]
    assert b"wrote \\udc80/report.html" in r.stdout
    assert (tmp_path / os.fsdecode(b"\x80") / "report.html").is_file()
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    with contextlib.redirect_stdout(out):
        assert main(["list", "models"]) == 0
    assert out.errors == "strict"
