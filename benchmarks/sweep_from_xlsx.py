"""Convert the Hagemann et al. 2023 spreadsheets into the sweep CSV the benchmarks read.

Hagemann et al. 2023, "Efficient Parallelization Layouts for Large-Scale Distributed Model Training"
(arXiv:2311.05610), published its measured layouts as spreadsheets (CC BY-NC-SA 4.0, so paraplan does
not ship them): GitHub Aleph-Alpha/NeurIPS-WANT-submission-efficient-parallelization-layouts, data/*.xlsx
and data/seqpara/*.xlsx at commit e13c2cb5. Download that folder, then

    python benchmarks/sweep_from_xlsx.py DATA_DIR --out sweep_2k.csv
    PARAPLAN_SWEEP_CSV=sweep_2k.csv python benchmarks/accuracy.py

Each workbook's first sheet has a title row, then one row per run with the columns Trial ID, World Size,
Average Step Time (s), Average TFlops Aleph Alpha, Average MFU (a fraction, or "OOM Error" / "Other
Error"), activation_checkpointing_type (every_layer / disabled), kernel, micro_batch_size,
model_parallel_size (tensor parallel), pipe_parallel_size and, in data/seqpara, sequence_parallel.
Written, one row per run (columns paraplan.calibration.sweep.SWEEP_COLUMNS):
  sheet (the workbook's name), model (llama1-13b / -30b / -65b from it), seq_len (8192 for the
  "8k_seq_length" workbooks, else 2048), gpus, global_batch_tokens (4,194,304: the paper's global batch
  of 2048 sequences of 2048 tokens), trial, kernel, checkpointing, micro_batch, tp, pp, sp (0/1), oom
  (1: "OOM Error"), measured_mfu, measured_step_s, tflops_aleph_alpha.
Only the 2k-sequence workbooks are converted unless ``--all-lengths`` (the paper's global batch for the
8k workbooks is not in them); runs that failed for another reason than memory ("Other Error") are
left out and counted. Needs openpyxl (pip install openpyxl).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paraplan.calibration.sweep import SWEEP_COLUMNS  # noqa: E402

#: the paper's global batch: 2048 sequences of 2048 tokens
GLOBAL_BATCH_TOKENS = 4_194_304
#: spreadsheet column -> CSV column
COLUMNS = {"Trial ID": "trial", "World Size": "gpus", "Average Step Time": "measured_step_s",
           "Average TFlops Aleph Alpha": "tflops_aleph_alpha", "activation_checkpointing_type": "checkpointing",
           "kernel": "kernel", "micro_batch_size": "micro_batch", "model_parallel_size": "tp",
           "pipe_parallel_size": "pp"}
OOM, OTHER = "OOM Error", "Other Error"


def workbook_rows(path: Path) -> tuple[pd.DataFrame, int]:
    """(the runs of one workbook in the CSV's columns, the count of runs left out as "Other Error")."""
    stem = path.stem
    m = re.search(r"llama_(\d+)B", stem)
    if m is None:
        raise ValueError(f"{path.name}: not a Llama workbook of the sweep (no 'llama_<N>B' in its name)")
    table = pd.read_excel(path, header=1, engine="openpyxl")
    missing = [c for c in (*COLUMNS, "Average MFU") if c not in table.columns]
    if missing:
        raise ValueError(f"{path.name}: missing column(s) {', '.join(missing)}")
    mfu_text = table["Average MFU"].astype(str).str.strip()
    other = int((mfu_text == OTHER).sum())
    table = table[mfu_text != OTHER].reset_index(drop=True)
    oom = (table["Average MFU"].astype(str).str.strip() == OOM)
    out = table[list(COLUMNS)].rename(columns=COLUMNS)
    out["measured_mfu"] = pd.to_numeric(table["Average MFU"].where(~oom), errors="coerce")
    for col in ("measured_step_s", "tflops_aleph_alpha"):
        out[col] = pd.to_numeric(out[col].where(~oom), errors="coerce")
    out["oom"] = oom.astype(int)
    sp = table["sequence_parallel"] if "sequence_parallel" in table.columns else False
    out["sp"] = pd.Series(sp, index=table.index).astype(str).str.strip().str.lower().isin(("true", "1", "1.0")).astype(int)
    out["sheet"] = stem
    out["model"] = f"llama1-{m.group(1).lower()}b"
    out["seq_len"] = 8192 if "8k_seq_length" in stem else 2048
    out["global_batch_tokens"] = GLOBAL_BATCH_TOKENS
    for col in ("gpus", "trial", "micro_batch", "tp", "pp"):
        out[col] = pd.to_numeric(out[col]).astype(int)
    return out[list(SWEEP_COLUMNS)], other


def convert(data_dir: Path, all_lengths: bool = False) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every run of the workbooks under ``data_dir`` (and its seqpara/ folder), and the "Other Error"
    runs left out per workbook."""
    books = sorted(p for p in list(data_dir.glob("*.xlsx")) + list(data_dir.glob("seqpara/*.xlsx"))
                   if all_lengths or "8k_seq_length" not in p.stem)
    if not books:
        raise ValueError(f"no workbook (*.xlsx) in {data_dir} or {data_dir / 'seqpara'}")
    frames, left_out = [], {}
    for book in books:
        rows, other = workbook_rows(book)
        frames.append(rows)
        left_out[book.stem] = other
    return pd.concat(frames, ignore_index=True), left_out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path, help="the downloaded data/ folder (with its seqpara/ folder)")
    ap.add_argument("--out", type=Path, default=Path("sweep_2k.csv"), help="the CSV to write")
    ap.add_argument("--all-lengths", action="store_true", help="convert the 8k-sequence workbooks too")
    args = ap.parse_args(argv)
    try:
        table, left_out = convert(args.data_dir, args.all_lengths)
    except (ValueError, ImportError) as e:
        print(f"sweep_from_xlsx.py: {e}", file=sys.stderr)
        return 2
    table.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(table)} runs ({int(table.oom.sum())} out of memory) from {len(left_out)} "
          f"workbooks; left out as 'Other Error': {sum(left_out.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
