"""The fit service: what every face calls to fit (:mod:`dkmeans.fit.service`).

Its modules, each with one job: :mod:`~dkmeans.fit.params` (the one table of parameters of
the three faces), :mod:`~dkmeans.fit.inputs` (the dataset and weight checks),
:mod:`~dkmeans.fit.metric_inputs` (the metric's preparation of rows and centroids),
:mod:`~dkmeans.fit.spec` (what a face asks, what it gets), :mod:`~dkmeans.fit.first_pass`
(the first pass over the placed data), :mod:`~dkmeans.fit.runs` (the runs and their phases),
:mod:`~dkmeans.fit.minibatch` (the mini-batch fit), :mod:`~dkmeans.fit.checkpoint_job`,
:mod:`~dkmeans.fit.inference` (labels, distances and objective for every input kind: every
face's inference and the final pass) and :mod:`~dkmeans.fit.results` (the end of a fit).
Every fit, sweep and score places its data through :mod:`~dkmeans.fit.placement` (one entry,
over the engine's policy in :mod:`dkmeans.engine.place`).
"""
