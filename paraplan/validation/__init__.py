"""Validation harness: run a plan on real torch under torchrun and compare with the estimate.

Entry points
------------
* :func:`paraplan.validation.sizing.size_run` -- the run ``validate`` launches: a
  :class:`paraplan.plan.Plan` as the harness runs it (:mod:`paraplan.validation.support`: what it
  runs, runs as something else or refuses, and its own limits), the harness's GPT
  (:class:`paraplan.validation.config.GPTConfig`) sized for the machine and the plan file's model,
  and the run's :class:`~paraplan.validation.config.RunOptions`; no torch.
* :func:`paraplan.validation.launch.launch_worker` / ``launch_worker_batch`` -- run them
  (:func:`paraplan.validation.config.run_spec`) under torchrun, return per-rank results.
* :func:`paraplan.validation.reference.compare_to_reference` -- loss/gradient agreement with
  the single-process run (:func:`~paraplan.validation.reference.reference_run`).
* :func:`paraplan.validation.compare.build_report` -- report.json, table and figure, with the
  prediction passed in as a plain dict.
* :func:`paraplan.validation.profile.run_profile` and :func:`paraplan.profiles.store.measured_tables` -- micro-benchmarks
  into the SQLite store (:class:`paraplan.profiles.store.ProfileStore`) and back out.
* :func:`paraplan.validation.predict.predict_run` -- the prediction: ``estimate`` of the same
  model and plan on ``load_cluster('local')``, this machine's profile as a cluster
  (:mod:`paraplan.profiles.cluster`, :class:`paraplan.costmodels.profiled.ProfiledCurves`),
  profiling first when the database has none.
* :mod:`paraplan.cli.validate` -- ``paraplan validate`` / ``paraplan profile``.
* ``benchmarks/validation_error.py`` -- a sweep of layouts through the harness: measured vs
  predicted step time and memory, median / worst errors, Spearman of step times.
"""
