"""Collaborative-filtering training on CPUs (HEAT-style tiled SimpleX).

numpy: :mod:`~paraplan.cf.model` (CFModel), :mod:`~paraplan.cf.data` (LightGCN files, synthetic
data), :mod:`~paraplan.cf.cost` (epoch time of a tiling), :mod:`~paraplan.cf.plan` (tile sizes from
the caches). torch: :mod:`~paraplan.cf.kernels` (tiled and baseline steps),
:mod:`~paraplan.cf.profile` (measured rates), :mod:`~paraplan.cf.validate` (a real run of the pick).
"""
