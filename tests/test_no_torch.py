"""The planner and estimator must not need torch (issue 2): run them with torch made unimportable."""
import subprocess
import sys

SCRIPT = """
import sys
sys.modules['torch'] = None          # any 'import torch' now raises ImportError
from paraplan.cli import main
assert main(['estimate', '--model', 'llama3-8b', '--cluster', 'dgx-h100', '--tp', '2', '--format', 'json']) == 0
assert main(['plan', '--model', 'llama3-8b', '--cluster', 'dgx-h100', '--top', '2', '--format', 'csv']) == 0
assert main(['list', 'models']) == 0
"""


def test_estimate_and_plan_run_without_torch():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_costmodels_planner_and_profiles_import_without_torch():
    code = ("import sys\nsys.modules['torch'] = None\n"
            "import paraplan.costmodels.estimate, paraplan.planner, paraplan.planner.search, "
            "paraplan.planner.space, paraplan.planner.stages, paraplan.planner.export, paraplan.profiles.store, "
            "paraplan.profiles.cluster, paraplan.scenario, paraplan.cf.plan, paraplan.cf.cost\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
