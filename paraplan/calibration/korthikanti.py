"""Held out: Korthikanti et al. 2022 (arXiv:2205.05198) on Selene, DGX A100-80GB (data/korthikanti2022.yaml).

The four models of the paper's Table 3, with the execution configurations calculon's validation set
encodes; measured: Table 5 step times (full recomputation; sequence parallelism + selective
recomputation) and Fig. 1 activation memory (none; sequence parallelism + selective). None of these
figures enters a calibration: they judge it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.io import read_yaml
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel

KORTHIKANTI_FILE = Path(__file__).parent / "data" / "korthikanti2022.yaml"
_DOC = read_yaml(KORTHIKANTI_FILE)


def _model(spec):
    """A preset name, or the shape the file gives (a model with no preset)."""
    return spec if isinstance(spec, str) else TransformerModel(**spec)


#: name -> (model or preset, GPUs, global batch, layout)
KORTHIKANTI_SETUPS = {name: (_model(s["model"]), s["gpus"], s["global_batch"], dict(s["layout"]))
                      for name, s in _DOC["setups"].items()}
#: name -> (full recomputation, SP + selective) step time, s
KORTHIKANTI_TABLE5_STEP_S = {name: tuple(s["table5_step_s"]) for name, s in _DOC["setups"].items()}
#: name -> (no recomputation, SP + selective) activation memory per GPU, GiB
KORTHIKANTI_FIG1_ACTIVATIONS_GIB = {name: tuple(s["fig1_activations_gib"]) for name, s in _DOC["setups"].items()}


def korthikanti_estimate(name: str, estimate_fn, **plan):
    """Estimate one Korthikanti setup with extra plan fields (recompute, sp)."""
    model, gpus, gbs, layout = KORTHIKANTI_SETUPS[name]
    model = load_model(model) if isinstance(model, str) else model
    return estimate_fn(model, TrainingJob(_DOC["seq_len"], gbs), load_cluster(_DOC["cluster"], gpus),
                       Plan(**_DOC["plan"], **layout, **plan))


def korthikanti_table() -> pd.DataFrame:
    """Predicted vs measured for the held-out Korthikanti rows (step time and activation memory)."""
    rows = []
    for name in KORTHIKANTI_SETUPS:
        for mode, extra, step, act in (
                ("full recompute", dict(recompute="full"), KORTHIKANTI_TABLE5_STEP_S[name][0], None),
                ("SP + selective", dict(recompute="selective", sp=True), KORTHIKANTI_TABLE5_STEP_S[name][1],
                 KORTHIKANTI_FIG1_ACTIVATIONS_GIB[name][1]),
                ("no recompute", {}, None, KORTHIKANTI_FIG1_ACTIVATIONS_GIB[name][0])):
            e = korthikanti_estimate(name, estimate, **extra)
            act_pred = e.memory_bytes_per_gpu["activations"] / 2**30
            rows.append({"model": name, "mode": mode, "step_measured_s": step, "step_predicted_s": e.step_time_s,
                         "step_error_%": None if step is None else 100 * (e.step_time_s / step - 1),
                         "act_measured_GiB": act, "act_predicted_GiB": act_pred,
                         "act_error_%": None if act is None else 100 * (act_pred / act - 1)})
    return pd.DataFrame(rows)
