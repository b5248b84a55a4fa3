"""The self-contained HTML what-if report: figures as base64 PNG, the scenario, the best plan per
point with its breakdown, the assumptions and the efficiency curves. No external resources.

A small script records, on ``load``, how many images decoded and how many script errors or
``console.error`` calls happened, in ``<div id="report-check">`` (read by the headless test).
"""
from __future__ import annotations

import base64
import html
import json

import yaml

from paraplan.costmodels.estimate import MEMORY_TERMS, TIME_TERMS
from paraplan.reports.data import describe_point, format_value, si
from paraplan.reports.sweep import GIB, LABELS
from paraplan.reports.text import MEMORY_LABELS, TIME_LABELS, significant

FIGURE_ORDER = ("scaling", "throughput", "breakdown", "timeline", "memory", "heatmap", "pareto", "cost", "efficiency")
FIGURE_TITLES = {"scaling": "Scaling curve", "throughput": "Throughput across the sweep",
                 "breakdown": "Step-time breakdown", "timeline": "Predicted step timeline (fastest point)",
                 "memory": "Memory per GPU",
                 "heatmap": "tp × pp heat-map (base scenario)", "pareto": "Pareto front: time, cost, memory",
                 "cost": "Cost to train", "efficiency": "Efficiency curves used"}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;
line-height:1.4;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;color:#555}
table{border-collapse:collapse;font-size:.82em;margin:.5em 0}th,td{border:1px solid #ddd;padding:2px 6px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}tr.bad td{color:#a33}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}details{margin:.3em 0}
.muted{color:#777}.skip li{color:#555}
"""

CHECK_SCRIPT = """
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e.type)); }, true);
  var original = console.error;
  console.error = function () { errors.push(Array.prototype.join.call(arguments, ' ')); original.apply(console, arguments); };
  window.addEventListener('load', function () {
    var imgs = document.images, ok = 0;
    for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
    var el = document.getElementById('report-check');
    el.setAttribute('data-images-loaded', ok);
    el.setAttribute('data-images-total', imgs.length);
    el.setAttribute('data-errors', errors.length);
    el.setAttribute('data-error-messages', errors.join(' | '));
    el.setAttribute('data-status', 'done');
  });
})();
"""

CAPTIONS = {
    "scaling": "Predicted tokens/s of the best plan at each GPU count (log-log), the ideal linear line from the "
               "first point that fits, and MFU in the panel below. '% of linear' is tokens/s divided by that "
               "ideal (the first fitting point's tokens/s times the GPU ratio); it exceeds 100 % when a larger "
               "cluster allows a plan with a higher MFU than the first point's (its note gives both MFUs)."
               " The shaded band is the 90 % prediction interval from the calibration residuals of the hardware "
               "generation (none for hardware without calibration data).",
    "throughput": "Predicted tokens/s (top) and MFU (bottom) of the best plan at each value of the swept "
                  "variable, one line per value of the second swept variable; with two lines or fewer the "
                  "points are labelled with their plan."
                  " The shaded band is the 90 % prediction interval from the calibration residuals of the "
                  "hardware generation (none for hardware without calibration data).",
    "breakdown": "Where each optimizer step goes, stacked; the bar height is the predicted step time.",
    "timeline": "The fastest point's predicted step laid out in time: per pipeline rank the forward, backward "
                "(and deferred weight-gradient) and recomputation of each micro-batch in the schedule's order, the "
                "bubble hatched, then the rank's communication (tp, cp, ep, pipeline receives) and its data-parallel "
                "and offload traffic (the hidden part pale). The starred rank sets the pace: its bars add up to the "
                "breakdown's terms. paraplan estimate --trace FILE.json writes the same as a Chrome / Perfetto trace.",
    "memory": "Per-GPU memory of the peak pipeline stage, stacked, against the GPU's HBM.",
    "heatmap": "Best predicted tokens/s for each (tp, pp), best over every other axis; hatched cells have legal "
               "layouts but none fits in memory, '–' has no legal layout.",
    "pareto": "Each point's wall-clock time against GPU-hours (and dollars), memory as colour; ringed points are "
              "not beaten on time, cost and memory at once.",
    "cost": "Days and cost to train the given number of tokens at each point.",
    "efficiency": "The efficiency curve behind the compute times (square GEMMs; fused attention plateau).",
}


def clusters_text(sc) -> str:
    """The cluster(s) of a scenario: the swept ones when ``cluster`` is swept, else the base one."""
    for s in sc.sweeps:
        if s.var == "cluster":
            return ", ".join(s.items)
    return sc.cluster


def _e(x) -> str:
    return html.escape(str(x))


def _img(name: str, png: bytes, title: str, has_data: bool) -> str:
    """A figure with its caption, naming the files the report wrote for it (the CSV only if written)."""
    b64 = base64.b64encode(png).decode("ascii")
    files = f"figures/{name}.png, .svg" + (f"; data/{name}.csv" if has_data else "")
    return (f'<figure id="fig-{name}"><img alt="{_e(title)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{_e(title)}.</b> {_e(CAPTIONS.get(name, ''))} "
            f'<span class="muted">({files})</span></figcaption></figure>')


def _points_table(r) -> str:
    sweep_vars = [s.var for s in r.scenario.sweeps]
    head = "".join(f'<th class="l">{_e(LABELS[v])}</th>' for v in sweep_vars)
    rows = []
    for pr in r.points:
        e = pr.estimate
        cells = "".join(f'<td class="l">{_e(format_value(v, pr.point.values[v]))}</td>' for v in sweep_vars)
        if e is None:
            rows.append(f'<tr class="bad">{cells}<td class="l" colspan="8">{_e(pr.reason)}</td></tr>')
            continue
        p = e.plan
        plan = (f"{p.label()} · {p.schedule} · ZeRO-{p.zero} · recompute {p.recompute} · offload {p.offload}"
                f"{' (+params)' if p.offload_params else ''}")
        cls = "" if pr.feasible else ' class="bad"'
        rows.append(f"<tr{cls}>{cells}<td>{pr.point.cluster.num_gpus}</td><td class=\"l\">{_e(plan)}</td>"
                    f"<td>{significant(e.step_time_s)}</td><td>{si(e.tokens_per_s)}</td><td>{100 * e.mfu:.1f}</td>"
                    f"<td>{e.memory_bytes_per_gpu['total'] / GIB:.1f}</td>"
                    f"<td>{e.details['gpu_memory_bytes'] / GIB:.0f}</td>"
                    f"<td class=\"l\">{'fits' if pr.feasible else _e(pr.reason)}</td></tr>")
    return (f"<table><tr>{head}<th>GPUs</th><th class=\"l\">best plan</th><th>step (s)</th><th>tokens/s</th>"
            f"<th>MFU %</th><th>mem GiB</th><th>HBM GiB</th><th class=\"l\">fits</th></tr>{''.join(rows)}</table>")


def _breakdowns(r) -> str:
    out = []
    for pr in r.points:
        e = pr.estimate
        label = ", ".join(f"{LABELS[k]} {format_value(k, v)}" for k, v in pr.point.values.items())
        if e is None:
            out.append(f"<details><summary>{_e(label)}: no plan</summary><p>{_e(pr.reason)}</p></details>")
            continue
        t = "".join(f'<tr><td class="l">{_e(TIME_LABELS[k])}</td><td>{significant(e.time_breakdown_s[k])}</td>'
                    f"<td>{100 * e.time_breakdown_s[k] / e.step_time_s:.1f}</td></tr>" for k in TIME_TERMS)
        m = "".join(f'<tr><td class="l">{_e(MEMORY_LABELS[k])}</td><td>{e.memory_bytes_per_gpu[k] / GIB:.2f}</td></tr>'
                    for k in MEMORY_TERMS)
        out.append(f"<details><summary>{_e(label)}: {_e(e.plan.label())}, {significant(e.step_time_s)} s/step, "
                   f"{e.memory_bytes_per_gpu['total'] / GIB:.1f} GiB/GPU</summary>"
                   f'<div style="display:flex;gap:2em;flex-wrap:wrap"><table><tr><th class="l">time term</th>'
                   f"<th>s</th><th>%</th></tr>{t}<tr><th class=\"l\">step</th><th>{significant(e.step_time_s)}</th><th>100</th>"
                   f'</tr></table><table><tr><th class="l">memory term</th><th>GiB</th></tr>{m}<tr><th class="l">total'
                   f"</th><th>{e.memory_bytes_per_gpu['total'] / GIB:.2f}</th></tr></table>"
                   f"<pre>{_e(json.dumps(e.plan.to_dict()))}</pre></div></details>")
    return "".join(out)


def _assumptions(r) -> str:
    ests = [pr.estimate for pr in r.points if pr.estimate is not None]
    if not ests:
        return "<p>No estimate was made.</p>"
    e = ests[0]
    items = "".join(f"<li>{_e(a)}</li>" for a in e.assumptions)
    curves = {}
    for x in ests:
        curves.setdefault(x.efficiency_curves.get("accelerator", "?"), x.efficiency_curves)
    rows = []
    for acc, c in curves.items():
        rows.append("".join(f"<tr><td class=\"l\">{_e(acc)}</td><td class=\"l\">{_e(k)}</td><td>{_e(v)}</td></tr>"
                            for k, v in c.items() if k != "accelerator"))
    return (f"<ul>{items}</ul><p><b>FLOP convention.</b> {_e(e.flop_convention)}</p>"
            f"<h3>Efficiency curves</h3><table><tr><th class=\"l\">accelerator</th><th class=\"l\">parameter</th>"
            f"<th>value</th></tr>{''.join(rows)}</table>")


def render_html(r, images: dict[str, bytes]) -> str:
    """The report page; ``images`` maps figure name to PNG bytes."""
    sc = r.scenario
    df = r.table
    figs = "".join(_img(n, images[n], FIGURE_TITLES[n], n in r.data) for n in FIGURE_ORDER
                   if n in images and n != "efficiency")
    skipped = "".join(f"<li><b>{_e(FIGURE_TITLES[n])}</b>: {_e(why)}</li>" for n, why in r.skipped.items())
    mode = ("re-planned at each point (best plan by search)" if sc.replans
            else "one fixed plan, re-estimated at each point")
    sweeps = "; ".join(f"{_e(s.label)}: {_e(', '.join(s.items))}" for s in sc.sweeps)
    heat = ""
    if r.heatmap_point is not None:
        heat = f"<p>Heat-map scenario: {_e(describe_point(r.heatmap_point))}.</p>"
    eff = (_img("efficiency", images["efficiency"], FIGURE_TITLES["efficiency"], "efficiency" in r.data)
           if "efficiency" in images else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>paraplan what-if — {_e(sc.model)} on {_e(clusters_text(sc))}</title>
<link rel="icon" href="data:,">
<style>{CSS}</style>
<script>{CHECK_SCRIPT}</script>
</head><body>
<h1>paraplan what-if report — {_e(sc.model)} on {_e(clusters_text(sc))}</h1>
<p>{len(df)} points ({int(df['feasible'].sum())} with a plan that fits), {mode}. Swept: {sweeps}.</p>
{heat}
<h2>Figures</h2>
{figs}
{f'<p>Not drawn for this sweep:</p><ul class="skip">{skipped}</ul>' if skipped else ''}
<h2>Best plan per point</h2>
{_points_table(r)}
<h2>Breakdown per point</h2>
{_breakdowns(r)}
<h2>Scenario</h2>
<p>Reproduce with <code>paraplan whatif --scenario scenario.yaml --out DIR</code>.</p>
<pre>{_e(yaml.safe_dump(sc.to_dict(), sort_keys=False))}</pre>
<h2>Assumptions</h2>
{_assumptions(r)}
{eff}
<div id="report-check" data-status="pending"></div>
</body></html>
"""
