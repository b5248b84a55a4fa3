"""Where the Hagemann et al. 2023 sweep is read from.

Hagemann et al. 2023, "Efficient Parallelization Layouts for Large-Scale Distributed Model Training"
(arXiv:2311.05610), measured 522 layouts of Llama-1 13B / 30B / 65B at sequence length 2048 on DGX
A100-80GB (MFU and step time, or out of memory). Its spreadsheets are licensed CC BY-NC-SA 4.0, so the
repository does not ship them or a table made from them: a user downloads them and converts them with
``benchmarks/sweep_from_xlsx.py``, then names the CSV with ``--sweep-csv PATH`` or the environment
variable :data:`SWEEP_ENV`. Without it the benchmarks and the tests that need it leave the sweep out
and say so (:data:`HOW_TO_OBTAIN`).
"""
from __future__ import annotations

import os
from pathlib import Path

#: the environment variable that names the sweep's CSV
SWEEP_ENV = "PARAPLAN_SWEEP_CSV"
#: where the spreadsheets are published
SWEEP_REPOSITORY = "https://github.com/Aleph-Alpha/NeurIPS-WANT-submission-efficient-parallelization-layouts"
SWEEP_COMMIT = "e13c2cb5"
#: the columns of the CSV the benchmarks read (benchmarks/sweep_from_xlsx.py writes them)
SWEEP_COLUMNS = ("sheet", "model", "seq_len", "gpus", "global_batch_tokens", "trial", "kernel", "checkpointing",
                 "micro_batch", "tp", "pp", "sp", "oom", "measured_mfu", "measured_step_s", "tflops_aleph_alpha")
HOW_TO_OBTAIN = (
    "the Hagemann et al. 2023 sweep (arXiv:2311.05610) is not in the repository: its spreadsheets are "
    "CC BY-NC-SA 4.0. To score it, download data/*.xlsx and data/seqpara/*.xlsx from "
    f"{SWEEP_REPOSITORY} at commit {SWEEP_COMMIT}, convert them with "
    "`python benchmarks/sweep_from_xlsx.py DOWNLOADED_DATA_DIR --out sweep_2k.csv` (needs openpyxl), and pass "
    f"`--sweep-csv sweep_2k.csv` or set {SWEEP_ENV}=sweep_2k.csv")


def sweep_csv(path: str | os.PathLike | None = None) -> Path | None:
    """The sweep's CSV: ``path`` when given, else the file :data:`SWEEP_ENV` names, else None (not
    here). A path that does not exist is returned as it is: the caller reports it."""
    if path:
        return Path(path)
    named = os.environ.get(SWEEP_ENV, "").strip()
    return Path(named) if named else None


#: why a check that needs the sweep is skipped without it
SWEEP_SKIP_REASON = (f"the Hagemann et al. 2023 sweep is not shipped (CC BY-NC-SA 4.0): set {SWEEP_ENV} to the CSV "
                     "benchmarks/sweep_from_xlsx.py makes from its spreadsheets")


def sweep_available() -> Path | None:
    """The sweep's CSV when :data:`SWEEP_ENV` names one that exists, else None."""
    path = sweep_csv()
    return path if path is not None and path.is_file() else None
