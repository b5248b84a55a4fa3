"""Published training runs as data, read into calibration cases.

The package's published runs are two CSV files with a recipe sidecar each, and a held-out paper's
setups (paraplan/calibration/data/; docs/reference/README.md describes the columns and conventions):
  * published_runs_calibration.csv (+ .recipes.yaml): A100 and V100 runs (a100.py);
  * published_runs_calibration_h100.csv (+ .recipes.yaml): H100-class and Blackwell runs (h100.py);
  * korthikanti2022.yaml: Korthikanti et al. 2022's Table 5 and Fig. 1, held out (korthikanti.py).
A row becomes a :class:`CalibrationCase` (model, job, cluster, plan, measured step time, assumptions)
or is skipped with the reason; :func:`score` sets each against ``estimate``. ``paraplan score`` reads
a user's runs file with the same readers. The Hagemann et al. 2023 sweep is not shipped (sweep.py).
"""
from paraplan.calibration.a100 import (DEFAULT_CSV, case_from_row, load_cases, load_memory_cases,
                                       memory_case_from_row, short_source)
from paraplan.calibration.cases import (CalibrationCase, MemoryCase, PublishedRun, mape_by_source, score,
                                        system_of_row_gpu)
from paraplan.calibration.cells import (FILE_COLUMNS, REQUIRED_FILE_COLUMNS, THROUGHPUT_METRICS, cases_of_table,
                                        measured_step_time_s, offload_of_cell, read_runs_file, vocab_from_notes)
from paraplan.calibration.h100 import H100_CSV, case_from_h100_row, h100_source, load_h100_cases, source_name
from paraplan.calibration.korthikanti import (KORTHIKANTI_FIG1_ACTIVATIONS_GIB, KORTHIKANTI_SETUPS,
                                              KORTHIKANTI_TABLE5_STEP_S, korthikanti_estimate, korthikanti_table)
from paraplan.calibration.recipes import Recipes, a100_recipes, h100_recipes, load_recipes

__all__ = [
    "DEFAULT_CSV", "H100_CSV", "FILE_COLUMNS", "REQUIRED_FILE_COLUMNS", "THROUGHPUT_METRICS",
    "PublishedRun", "CalibrationCase", "MemoryCase", "Recipes",
    "load_cases", "load_memory_cases", "load_h100_cases", "case_from_row", "memory_case_from_row",
    "case_from_h100_row", "cases_of_table", "read_runs_file", "score", "mape_by_source",
    "short_source", "h100_source", "source_name", "system_of_row_gpu", "offload_of_cell", "vocab_from_notes",
    "measured_step_time_s", "a100_recipes", "h100_recipes", "load_recipes",
    "KORTHIKANTI_SETUPS", "KORTHIKANTI_TABLE5_STEP_S", "KORTHIKANTI_FIG1_ACTIVATIONS_GIB", "korthikanti_estimate",
    "korthikanti_table",
]
