"""Reports: plain-text estimates (``text``) and what-if sweeps with figures and an HTML report.

``paraplan.reports.whatif(...)`` is imported lazily so that the text renderer stays light.
"""
from __future__ import annotations

__all__ = ["whatif", "WhatIfResult"]


def __getattr__(name):
    if name in __all__:
        from paraplan.reports import report as _module
        return getattr(_module, name)
    raise AttributeError(f"module 'paraplan.reports' has no attribute {name!r}")
