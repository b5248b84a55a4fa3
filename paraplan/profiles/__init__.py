"""Measured profiles: the SQLite store (:mod:`~paraplan.profiles.store`) and a stored profile as a
cluster the estimator uses (:mod:`~paraplan.profiles.cluster`). No torch: measuring lives in
:mod:`paraplan.validation.profile`."""
