"""Command line: ``dkmeans fit | sweep | predict | evaluate | demo`` (also ``python -m dkmeans``).

Every user error ends with exit status 2 and one line on stderr. Progress is one line per
iteration: printed on a terminal, otherwise logged (logger ``dkmeans``, INFO, timestamped)
to stdout too, and neither with ``--quiet``. Progress and results share stdout so that a
captured log reads in the order things happened; stderr carries warnings and errors.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from dkmeans._version import __version__
from dkmeans.errors import DKMeansError, InvalidParameterError, JobInterrupted
from dkmeans.fit import params as _params
from dkmeans.fit.options import DEFAULT_BATCH_SIZE
from dkmeans.job_signals import JobSignals, signal_name

logger = logging.getLogger("dkmeans")


# -- the cluster -------------------------------------------------------------------
def connect(args):
    """The client the command runs on: ``--scheduler``, ``--local``/``--gpu``, or the embedded one."""
    scheduler = getattr(args, "scheduler", None)
    tls = (
        {}
        if not scheduler
        else {
            "timeout": args.connect_timeout,
            "tls_ca_file": args.tls_ca_file,
            "tls_cert": args.tls_cert,
            "tls_key": args.tls_key,
        }
    )
    from dkmeans.fit.cluster import connect_command

    # --local is the default: the embedded cluster; either is closed by main() before it returns
    client, opened = connect_command(
        scheduler, gpu=getattr(args, "gpu", False), n_workers=getattr(args, "workers", None), **tls
    )
    if opened:
        args.opened_client = client
    return client


def cluster_size(client) -> tuple[int, int]:
    """:func:`dkmeans.fit.cluster.cluster_size` (imported here when used: it loads distributed)."""
    from dkmeans.fit.cluster import cluster_size as workers_and_threads

    return workers_and_threads(client)


def connect_for_fit(args, X, params: dict) -> None:
    """Start or join the command's cluster (:func:`connect`) when the fit of ``X`` needs one.

    A fit the library runs in this process (files whose footers say their rows take at most
    ``dkmeans.in-process-bytes``: :func:`dkmeans.fit.placement.fits_in_caller`) starts none,
    unless the command names one (``--scheduler``, ``--gpu``): what the rows would gain from it
    is less than its start (seconds) and the round trip of every pass.
    """
    from dkmeans.fit.placement import fits_in_caller

    named = getattr(args, "scheduler", None) or getattr(args, "gpu", False)
    missing = params.get("missing", "error")
    if named or not fits_in_caller(
        X, missing=missing, out_of_core=params.get("out_of_core", "auto")
    ):
        connect(args)


def _verbose(args) -> int:
    """Print progress only on a terminal; elsewhere the INFO log (on stdout, see :func:`_log_to`) carries it."""
    return int(not args.quiet and not getattr(args, "json", False) and sys.stdout.isatty())


_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


class _Below:
    """A logging filter passing records below ``level``."""

    def __init__(self, level: int):
        self.level = level

    def filter(self, record) -> bool:
        return record.levelno < self.level


def _log_to(quiet: bool, to_stderr: bool = False):
    """Set up the ``dkmeans`` logger for one command; returns a function that restores it.

    On a terminal, or with ``--quiet``: warnings only (progress is printed, or silenced).
    Otherwise INFO records (progress, the embedded cluster's address) go to stdout, the
    stream that carries the results, so a log captured from stdout (or from both streams)
    has them in order; warnings and errors go to stderr. ``to_stderr`` (``--json``, whose
    stdout is the JSON line alone): INFO records go to stderr too.
    """
    root = logging.getLogger()
    root_handlers = list(root.handlers)
    logging.basicConfig(
        level=logging.WARNING, format=_LOG_FORMAT
    )  # other libraries: warnings on stderr
    added_to_root = [h for h in root.handlers if h not in root_handlers]
    for handler in added_to_root:
        # warnings only, whichever libraries' loggers log INFO through it: distributed, imported
        # after this (only where the command needs a cluster), finds this handler and sends its
        # records here instead of adding a handler of its own
        handler.setLevel(logging.WARNING)
    saved = logger.level, logger.propagate, list(logger.handlers)
    if quiet or (sys.stdout.isatty() and not to_stderr):
        logger.setLevel(logging.WARNING)
    else:
        info = logging.StreamHandler(sys.stderr if to_stderr else sys.stdout)
        info.addFilter(_Below(logging.WARNING))
        problems = logging.StreamHandler(sys.stderr)
        problems.setLevel(logging.WARNING)
        for handler in (info, problems):
            handler.setFormatter(logging.Formatter(_LOG_FORMAT))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # not also to the root handler on stderr

    def restore() -> None:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers[:] = saved[2]
        # The root handler basicConfig added writes to this sys.stderr, which a caller of main()
        # (a test capturing output) may close: a record logged through it later would end in
        # "--- Logging error ---".
        for handler in added_to_root:
            root.removeHandler(handler)

    return restore


def _numeric_columns(df, columns):
    """``--columns`` as given, or every numeric column but bools (saying which others were left out)."""
    from dkmeans.fit.tables import numeric_columns

    if columns:
        return list(columns)
    numeric, skipped = numeric_columns(df)
    if skipped:
        print(f"using numeric columns {numeric}; leaving out {skipped} (choose with --columns)")
    return numeric


# -- commands ----------------------------------------------------------------------
#: The fit options taken from the parameter table, by their service names (see :func:`_add_fit_options`).
FIT_OPTIONS = (
    "n_clusters",
    "init",
    "n_init",
    "max_iter",
    "tol",
    "random_state",
    "algorithm",
    "local_search",
    "out_of_core",
    "checkpoint_every",
    "metric",
    "prune",
    "missing",
    "max_cluster_size",
    "min_cluster_size",
    "balanced",
)


#: Options whose default is the estimator's (``KMeans``'s or ``MiniBatchKMeans``'s): left out unless given.
ESTIMATOR_DEFAULTS = ("checkpoint_every",)


#: The fit options of ``dkmeans sweep``: those of ``fit`` but ``-k`` (the values of k) and the checkpoint's.
SWEEP_OPTIONS = tuple(
    name
    for name in FIT_OPTIONS
    if name
    not in ("n_clusters", "checkpoint_every", "max_cluster_size", "min_cluster_size", "balanced")
)


def _fit_params(args, options=FIT_OPTIONS) -> dict:
    """The fit options as ``KMeans`` keywords, checked against the table under their CLI names.

    Options of :data:`ESTIMATOR_DEFAULTS` not given are left out, so the estimator's default applies.
    """
    names = _params.face_names("cli")
    given = {p: getattr(args, "k" if p == "n_clusters" else _dest(names[p])) for p in options}
    given = {
        p: value for p, value in given.items() if not (p in ESTIMATOR_DEFAULTS and value is None)
    }
    checked = _params.check("cli", {names[p]: value for p, value in given.items()})
    estimator = _params.face_names("estimator")
    return {estimator[p]: value for p, value in checked.items()}


def _fit(args) -> int:
    from dkmeans.fit.tables import read_table, select_columns

    params = _fit_params(args)  # checked before the input is read or a cluster starts
    checkpoint = _checkpoint_option(args)
    df = read_table(args.input, storage_options=_storage_options(args))
    columns = [c for c in _numeric_columns(df, args.columns) if c not in (args.exclude or [])]
    X = select_columns(
        df, columns, name=str(args.input)
    )  # only these columns are read from the files
    connect_for_fit(args, X, params)
    t0 = time.perf_counter()
    km = _estimator(params, args, checkpoint)
    km.fit(X)
    seconds = time.perf_counter() - t0
    path = km.save(args.model)
    print(
        f"fitted k={km.n_clusters} on {len(columns)} columns in {seconds:.2f} s: {km.n_iter_} iterations "
        f"(stopped by {km.stop_reason_}), objective {km.inertia_:.6e}; data {km.data_mode_}, "
        f"{km.n_passes_} passes over it"
    )
    print(f"model written to {path}")
    args.summary = {
        "model": str(path),
        "n_clusters": int(km.n_clusters),
        "columns": list(columns),
        "n_iter": int(km.n_iter_),
        "stop_reason": km.stop_reason_,
        "inertia": float(km.inertia_),
        "seconds": round(seconds, 3),
        "data_mode": km.data_mode_,
        "n_passes": int(km.n_passes_),
    }
    if args.plot:
        _write_plot(args.plot, km, X)
        args.summary["plot"] = str(args.plot)
    return 0


def parse_k_values(text: str) -> list[int]:
    """``-k`` of ``dkmeans sweep``: ``lo:hi[:step]`` (``hi`` included when on the step), ``2,4,8``, or both
    (``2:10,16,32``); the values distinct and increasing."""
    from dkmeans.ksweep import check_k_values

    values = []
    for item in str(text).split(","):
        parts = item.strip().split(":")
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            raise InvalidParameterError(
                f"-k takes lo:hi[:step] ranges or lists like 2,4,8; got {text!r}"
            ) from None
        if len(numbers) == 1:
            values += numbers
        elif len(numbers) in (2, 3):
            lo, hi, step = numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1
            if step < 1 or hi < lo:
                raise InvalidParameterError(f"-k range {item!r} needs lo <= hi and a step >= 1")
            values += list(range(lo, hi + 1, step))
        else:
            raise InvalidParameterError(
                f"-k takes lo:hi[:step] ranges or lists like 2,4,8; got {text!r}"
            )
    try:
        return check_k_values(values)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"-k: {exc}") from None


def _sweep(args) -> int:
    from dkmeans import sweep
    from dkmeans.fit.tables import read_table, select_columns

    ks = parse_k_values(args.k_values)  # checked before the input is read or a cluster starts
    params = _fit_params(args, SWEEP_OPTIONS)
    df = read_table(args.input, storage_options=_storage_options(args))
    columns = [c for c in _numeric_columns(df, args.columns) if c not in (args.exclude or [])]
    X = select_columns(
        df, columns, name=str(args.input)
    )  # only these columns are read from the files
    connect_for_fit(args, X, params)
    result = sweep(
        X,
        ks,
        verbose=_verbose(args),
        device="gpu" if args.gpu else None,
        method=args.method,
        **params,
    )
    print(
        f"swept {len(ks)} values of k on {len(columns)} columns in {result.seconds:.2f} s "
        f"(data {result.data_mode}, random_state {result.random_state}: any k refits alone with "
        f"dkmeans fit -k K --random-state {result.random_state})"
    )
    print(result.format_table())
    args.summary = {
        "k_values": list(ks),
        "rows": result.rows(),
        "suggested_k": result.suggested_k,
        "rule": result.rule,
        "random_state": result.random_state,
        "data_mode": result.data_mode,
        "n_passes": int(result.n_passes),
        "seconds": round(result.seconds, 3),
    }
    if args.save_models:
        folder = Path(args.save_models)
        folder.mkdir(parents=True, exist_ok=True)
        # every k (method refit), or the suggested k's refit (method bisecting)
        paths = [result.models[k].save(folder / f"kmeans-k{k}.npz") for k in sorted(result.models)]
        print(f"models written to {folder}: {', '.join(p.name for p in paths)}")
        args.summary["models"] = [str(p) for p in paths]
    if args.plot:
        result.plot(args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _bisect(args) -> int:
    from dkmeans import BisectingKMeans
    from dkmeans.fit.tables import read_table, select_columns

    names = _params.face_names("cli")
    given = {
        "n_clusters": args.k,
        "n_init": args.n_init,
        "max_iter": args.max_iter,
        "tol": args.tol,
        "bisecting_strategy": args.bisecting_strategy,
        "out_of_core": args.out_of_core,
    }
    # checked before the input is read or a cluster starts
    params = _params.check("cli", {names[p]: value for p, value in given.items()})
    df = read_table(args.input)
    columns = [c for c in _numeric_columns(df, args.columns) if c not in (args.exclude or [])]
    X = select_columns(df, columns, name=str(args.input))  # only these columns are read
    connect_for_fit(args, X, params)
    t0 = time.perf_counter()
    model = BisectingKMeans(init=args.init, random_state=args.random_state, **params).fit(X)
    seconds = time.perf_counter() - t0
    print(
        f"bisected to k={args.k} on {len(columns)} columns in {seconds:.2f} s: "
        f"{model.n_rounds_} rounds of shared passes, {model.n_passes_} passes over the data "
        f"({model.data_mode_}), objective {model.inertia_:.6e}"
    )
    objectives = model.inertia_per_k_
    print(f"{'k':>6}  {'objective':>14}  {'drop':>8}")
    for k, objective in enumerate(objectives, start=1):
        drop = "" if k == 1 else f"{1 - objective / objectives[k - 2]:8.2%}"
        print(f"{k:6d}  {objective:14.6e}  {drop:>8}")
    if args.output:
        with open(args.output, "w") as out:
            out.write("k,objective\n")
            out.writelines(f"{k},{float(o)!r}\n" for k, o in enumerate(objectives, start=1))
        print(f"objective per k written to {args.output}")
    return 0


def _add_bisect_parser(sub) -> None:
    bisect = sub.add_parser(
        "bisect",
        help="bisecting k-means (scikit-learn's BisectingKMeans) on "
        "Parquet/CSV; print the objective at every k from 1 to -k (one fit)",
    )
    bisect.add_argument("input", help="Parquet file/directory/glob or CSV file/glob")
    bisect.add_argument("-k", type=int, required=True, help="number of clusters (leaves)")
    bisect.add_argument(
        "--columns", nargs="+", help="columns to cluster on (default: all numeric columns)"
    )
    bisect.add_argument(
        "--exclude", nargs="+", help="columns to leave out (e.g. known labels or ids)"
    )
    bisect.add_argument(
        "--init",
        choices=list(_params.BISECTING_INITS),
        default="random",
        help="start of each 2-means (default random)",
    )
    bisect.add_argument(
        "--n-init", type=int, default=1, help="starts of each 2-means, the best kept (default 1)"
    )
    bisect.add_argument(
        "--max-iter", type=int, default=300, help="Lloyd iterations of each 2-means (default 300)"
    )
    bisect.add_argument(
        "--tol",
        type=float,
        default=1e-4,
        help="a 2-means stops when its centres' squared shift is at most this (default 0.0001)",
    )
    bisect.add_argument("--random-state", type=int, help="seed of the starts")
    strategy = _params.PARAMS["bisecting_strategy"]
    bisect.add_argument(
        strategy.cli,
        choices=list(strategy.constraint.options),
        default="biggest_inertia",
        help=f"{strategy.doc} (default biggest_inertia)",
    )
    bisect.add_argument(
        "--out-of-core", type=_auto_or_bool, default="auto", help=_params.PARAMS["out_of_core"].doc
    )
    bisect.add_argument(
        "--output", metavar="FILE", help="write the objective per k as CSV (k,objective)"
    )
    bisect.add_argument("--quiet", action="store_true", help="no progress")
    _cluster_options(bisect)
    bisect.set_defaults(handler=_bisect)


def _estimator(params: dict, args, checkpoint):
    """``KMeans``, or ``MiniBatchKMeans`` for ``--algorithm minibatch`` (its options only)."""
    from dkmeans import KMeans, MiniBatchKMeans

    device = "gpu" if args.gpu else None
    checked = _params.check(
        "cli", {"--batch-size": args.batch_size, "--max-no-improvement": args.max_no_improvement}
    )
    if params["algorithm"] != "minibatch":
        return KMeans(**params, verbose=_verbose(args), checkpoint=checkpoint, device=device)
    if params["metric"] != "euclidean":
        raise InvalidParameterError("--algorithm minibatch is Euclidean only")
    keep = (
        "n_clusters",
        "init",
        "n_init",
        "max_iter",
        "tol",
        "random_state",
        "out_of_core",
        "checkpoint_every",
        "missing",
    )
    return MiniBatchKMeans(
        **{name: params[name] for name in keep if name in params},
        **checked,
        verbose=_verbose(args),
        checkpoint=checkpoint,
        device=device,
    )


def _checkpoint_option(args):
    """``--checkpoint``/``--resume``: never overwrite a checkpoint unless asked to resume from it."""
    from dkmeans.io.checkpoint import checkpoint_path

    if args.checkpoint is None:
        if args.resume:
            raise InvalidParameterError(
                "--resume needs --checkpoint PATH (the checkpoint to resume from)"
            )
        return None
    path = checkpoint_path(args.checkpoint)
    if path.exists() and not args.resume:
        raise InvalidParameterError(
            f"checkpoint {path} already exists: pass --resume to continue from it, or remove it to start over"
        )
    if args.resume and not path.exists():
        print(f"no checkpoint at {path} yet: starting from the beginning")
    return path


def _write_plot(path, km, X):
    from dkmeans.plot import save_fit_plot

    sample = X.sample(frac=min(1.0, 20_000 / max(1, len(X))), random_state=0).compute()
    save_fit_plot(
        path,
        km.history_,
        sample.to_numpy(dtype=np.float64, na_value=np.nan),
        km.predict(sample),
        km.cluster_centers_,
    )  # nullable and Arrow columns as floats
    print(f"plot written to {path}")


def _load_model(path):
    """The estimator saved in ``path`` (``KMeans`` or ``MiniBatchKMeans``)."""
    from dkmeans import KMeans, MiniBatchKMeans
    from dkmeans.fit.model_files import saved_estimator

    return (MiniBatchKMeans if saved_estimator(path) == "dkmeans.MiniBatchKMeans" else KMeans).load(
        path
    )


def _predict(args) -> int:
    from dkmeans.fit.tables import read_table, write_parquet

    km = _load_model(args.model)
    km.set_params(missing=_params.check("cli", {"--missing": args.missing})["missing"])
    df = read_table(args.input, storage_options=_storage_options(args))
    features = list(getattr(km, "feature_names_in_", []))
    if not features:
        raise InvalidParameterError(
            "the model has no feature names; it was not fitted on named columns"
        )
    missing = [c for c in features if c not in df.columns]
    if missing:
        raise InvalidParameterError(f"the input lacks the model's columns {missing}")
    if args.label_column in df.columns:
        raise InvalidParameterError(
            f"the input already has a column {args.label_column!r}; choose --label-column"
        )
    connect(args)
    labels = km.predict(df[features])
    if (
        args.missing == "skip"
    ):  # rows with a missing feature: a null label (every input row is kept)
        labels = labels.where(labels >= 0).astype("Int32")
    out = df.assign(**{args.label_column: labels})
    write_parquet(out, args.output, storage_options=_storage_options(args))
    print(
        f"labels of {df.npartitions} partition(s) written to {args.output} (column {args.label_column!r})"
    )
    args.summary = {
        "output": str(args.output),
        "label_column": args.label_column,
        "partitions": int(df.npartitions),
    }
    return 0


def _evaluate(args) -> int:
    from dkmeans import metrics
    from dkmeans.fit.tables import read_table, select_columns

    km = _load_model(args.model)
    km.set_params(missing=_params.check("cli", {"--missing": args.missing})["missing"])
    df = read_table(args.input, storage_options=_storage_options(args))
    X = select_columns(df, list(km.feature_names_in_), name=str(args.input))
    if args.truth_column and args.truth_column not in df.columns:
        raise InvalidParameterError(f"truth column {args.truth_column!r} not found in the input")
    connect(args)
    objective = -km.score(X)
    n_rows = len(df)
    print(f"objective (sum of squared distances): {objective:.6e}")
    print(f"rows: {n_rows}")
    args.summary = {"objective": float(objective), "rows": int(n_rows)}
    if args.truth_column:
        # two integer columns come back to the client (the data stays on the cluster)
        pair = df[[args.truth_column]].assign(cluster=km.predict(X)).compute()
        truth, labels = pair[args.truth_column].to_numpy(), pair["cluster"].to_numpy()
        truth_means = df.groupby(args.truth_column)[list(X.columns)].mean().compute().to_numpy()
        scores = {
            "accuracy": float(metrics.accuracy(truth, labels)),
            "adjusted_rand_index": float(metrics.adjusted_rand_index(truth, labels)),
            "centroid_index": int(metrics.centroid_index(km.cluster_centers_, truth_means)),
        }
        print(f"accuracy (Hungarian matching): {scores['accuracy']:.4f}")
        print(f"adjusted Rand index: {scores['adjusted_rand_index']:.4f}")
        print(f"centroid index vs the truth's class means: {scores['centroid_index']}")
        args.summary.update(scores)
    return 0


def _warm_up(args) -> int:
    from dkmeans.fit.service import warm_up

    for value in args.n_features:
        _params.Int(1)("--n-features", value)
    started = time.perf_counter()
    warm_up(n_features=tuple(args.n_features))
    seconds = time.perf_counter() - started
    print(
        f"dkmeans warm-up: the kernels for float32 and float64 rows of {', '.join(map(str, args.n_features))} "
        f"features are in numba's disk cache ({seconds:.1f} s)"
    )
    args.summary = {"seconds": round(seconds, 3), "n_features": list(args.n_features)}
    return 0


def _demo(args) -> int:
    from sklearn.metrics import adjusted_rand_score

    from dkmeans import KMeans
    from dkmeans.fit.demo_data import demo_blobs
    from dkmeans.fit.tables import write_labels_parquet

    for option, value in (("--n-samples", args.n_samples), ("--n-features", args.n_features)):
        _params.Int(1)(option, value)
    _params.Int(1)("-k", args.k)
    if args.k > args.n_samples:
        raise InvalidParameterError(f"-k={args.k} is larger than --n-samples={args.n_samples}")
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    client = connect(args)
    n_workers, n_threads = cluster_size(client)
    print(
        f"dkmeans demo: Dask cluster with {n_workers} worker(s), {n_threads} thread(s); "
        f"dashboard {client.dashboard_link}"
    )
    t_data = time.perf_counter()
    X, true_centers = demo_blobs(
        client,
        args.n_samples,
        args.n_features,
        args.k,
        spread=args.spread,
        seed=args.seed,
        chunk_rows=args.chunk_rows,
    )
    print(
        f"data: {args.n_samples:,} x {args.n_features} float32 Gaussian blobs ({X.nbytes / 2**20:.0f} MiB) "
        f"generated on the workers in {X.numblocks[0]} chunks in {time.perf_counter() - t_data:.2f} s; "
        f"k = {args.k}"
    )

    t_fit = time.perf_counter()
    km = KMeans(
        n_clusters=args.k,
        max_iter=args.max_iter,
        tol=args.tol,
        random_state=args.seed,
        verbose=_verbose(args),
    ).fit(X)
    fit_seconds = time.perf_counter() - t_fit
    per_iter = [h["seconds"] for h in km.history_]

    # Quality against the generating centres (known here because the data is synthetic).
    truth_objective = -_centres_model(true_centers, km).score(X)
    ari = adjusted_rand_score(
        _centres_model(true_centers, km).predict(X).compute(), km.labels_.compute()
    )

    model_path = km.save(out_dir / "model.npz")
    labels_path = out_dir / "labels.parquet"
    write_labels_parquet(km.labels_, labels_path)
    plot_path = out_dir / "fit.png"
    try:
        from dkmeans.plot import save_fit_plot

        sample = X[:: max(1, args.n_samples // 20_000)].compute()
        save_fit_plot(plot_path, km.history_, sample, km.predict(sample), km.cluster_centers_)
    except DKMeansError as exc:  # matplotlib missing
        plot_path = f"(no plot: {exc})"

    print()
    print("summary")
    print(f"  initialisation      k-means|| (5 rounds, oversampling 2), random_state={args.seed}")
    print(f"  iterations          {km.n_iter_} (stopped by: {km.stop_reason_})")
    print(
        f"  objective           {km.inertia_:.6e}  ({km.inertia_ / truth_objective:.4f} x the objective "
        f"at the generating centres)"
    )
    print(f"  agreement with the generating clusters (adjusted Rand index): {ari:.4f}")
    print(
        f"  seconds/iteration   median {np.median(per_iter):.4f}, total fit {fit_seconds:.2f} s "
        f"(run {time.perf_counter() - t_start:.2f} s)"
    )
    print(f"  model               {model_path}")
    print(
        f"  labels              {labels_path}  (Parquet, column 'cluster', {args.n_samples:,} rows)"
    )
    print(f"  plot                {plot_path}")
    args.summary = {
        "model": str(model_path),
        "labels": str(labels_path),
        "n_iter": int(km.n_iter_),
        "stop_reason": km.stop_reason_,
        "inertia": float(km.inertia_),
        "adjusted_rand_index": float(ari),
        "seconds": round(fit_seconds, 3),
    }
    return 0


def _centres_model(centres, like):
    """A fitted ``KMeans`` whose centres are ``centres`` (to score the generating centres as inference would)."""
    from dkmeans import KMeans

    model = KMeans(n_clusters=len(centres))
    model.cluster_centers_ = np.asarray(centres, dtype=like.cluster_centers_.dtype)
    model.n_features_in_ = like.n_features_in_
    model._n_features_out = len(centres)
    return model


# -- parser ------------------------------------------------------------------------
def _cluster_options(p):
    g = p.add_argument_group("cluster (default: an embedded local cluster, one worker per core)")
    g.add_argument("--scheduler", metavar="ADDRESS", help="connect to a running Dask scheduler")
    g.add_argument("--local", action="store_true", help="start a local cluster (the default)")
    g.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes of the local cluster (default: one per core)",
    )
    g.add_argument(
        "--gpu",
        action="store_true",
        help="start a LocalCUDACluster (dask-cuda), one worker per GPU, and compute there (CuPy)",
    )
    g.add_argument(
        "--connect-timeout",
        default="10s",
        metavar="DURATION",
        help="how long to wait for --scheduler (default 10s)",
    )
    g.add_argument("--tls-ca-file", metavar="PATH", help="TLS: CA certificate of the scheduler")
    g.add_argument("--tls-cert", metavar="PATH", help="TLS: client certificate")
    g.add_argument("--tls-key", metavar="PATH", help="TLS: client key")


def _storage_value(text: str):
    """A ``--storage-option`` value: JSON where it parses (true, 3, null, {...}), else the text itself."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _storage_options(args) -> dict | None:
    """``--storage-options FILE.json`` then each ``--storage-option KEY=VALUE`` over it (dotted keys nest:
    ``client_kwargs.region_name=eu-west-1``); None when neither is given."""
    import json

    options = {}
    if getattr(args, "storage_options_file", None):
        try:
            with open(args.storage_options_file) as f:
                options = json.load(f)
        except OSError as exc:
            raise InvalidParameterError(
                f"--storage-options: cannot read {args.storage_options_file}: {exc.strerror or exc}"
            ) from None
        except ValueError as exc:
            raise InvalidParameterError(
                f"--storage-options: {args.storage_options_file} is not JSON: {exc}"
            ) from None
        if not isinstance(options, dict):
            raise InvalidParameterError(
                f"--storage-options: {args.storage_options_file} must hold a JSON object"
            )
    for item in getattr(args, "storage_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidParameterError(f"--storage-option takes KEY=VALUE, got {item!r}")
        *parents, leaf = key.strip().split(".")
        target = options
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise InvalidParameterError(f"--storage-option {item!r}: {part} is not an object")
        target[leaf] = _storage_value(value)
    return options or None


def _storage_arguments(p) -> None:
    """``--storage-option KEY=VALUE`` (repeated) and ``--storage-options FILE.json``: the filesystem's options."""
    g = p.add_argument_group(
        "object stores (s3://, gs://, abfs://: options of the filesystem, fsspec)"
    )
    g.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="an option of the input's (and output's) filesystem, repeated: e.g. "
        "endpoint_url=http://127.0.0.1:9000, key=..., secret=..., anon=true "
        "(values are JSON where they parse; dotted keys nest)",
    )
    g.add_argument(
        "--storage-options",
        dest="storage_options_file",
        metavar="FILE.json",
        help="a JSON object of filesystem options (--storage-option entries override it)",
    )


def _missing_argument(p) -> None:
    """``--missing`` of predict and evaluate (fit and sweep take it from the parameter table)."""
    param = _params.PARAMS["missing"]
    p.add_argument(
        param.cli,
        choices=list(_params.MISSING),
        default="error",
        help="rows with a missing value: 'error' (default), or 'skip': labelled with a null "
        "(predict; every input row is kept) or left out (evaluate)",
    )


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _int_or_auto(text: str):
    return text if text == "auto" else int(text)


def _int_or_none(text: str):
    return None if text.lower() == "none" else int(text)


def _size(text: str):
    """``--max-cluster-size``/``--min-cluster-size``: a count (integer) or a fraction of the rows (a float)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a count or a fraction in (0, 1], got {text!r}"
            ) from None


def _auto_or_bool(text: str):
    value = {"auto": "auto", "true": True, "yes": True, "false": False, "no": False}.get(
        text.lower()
    )
    if value is None:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}")
    return value


def _add_fit_options(parser, options=FIT_OPTIONS, minibatch: bool = True) -> None:
    """The fit options of ``options`` (:data:`FIT_OPTIONS`): names and help from the parameter table, defaults
    from ``KMeans``; with ``minibatch``, ``--algorithm minibatch`` and the mini-batch options."""
    import inspect

    from dkmeans import KMeans, MiniBatchKMeans

    defaults = {name: p.default for name, p in inspect.signature(KMeans).parameters.items()}
    minibatch_defaults = {
        name: p.default for name, p in inspect.signature(MiniBatchKMeans).parameters.items()
    }
    estimator = _params.face_names("estimator")
    types = {
        "n_init": _int_or_auto,
        "out_of_core": _auto_or_bool,
        "local_search": _auto_or_bool,
        "prune": _auto_or_bool,
        "tol": float,
        "max_cluster_size": _size,
        "min_cluster_size": _size,
        "random_state": int,
    }
    for name in options:
        param = _params.PARAMS[name]
        default = defaults.get(estimator[name])
        kwargs = {"help": f"{param.doc} (default {default})" if name != "n_clusters" else param.doc}
        if name in ESTIMATOR_DEFAULTS:
            kwargs["help"] = (
                f"{param.doc} (default {default}; {minibatch_defaults[estimator[name]]} with "
                "--algorithm minibatch)"
            )
            default = None
        if isinstance(param.constraint, _params.OneOf) and all(
            isinstance(o, str) for o in param.constraint.options
        ):
            kwargs["choices"] = [
                o for o in param.constraint.options if minibatch or o != "minibatch"
            ]
        elif name == "init":
            kwargs["choices"] = list(_params.INIT_STRATEGIES)
        else:
            kwargs["type"] = types.get(name, int)
        if name == "n_clusters":
            kwargs.update(required=True, dest="k")
        elif name == "balanced":  # a flag
            kwargs = {"help": param.doc, "action": "store_true"}
        else:
            kwargs["default"] = default
        parser.add_argument(param.cli, **kwargs)
    if not minibatch:
        return
    batch = _params.PARAMS["batch_size"]
    parser.add_argument(
        batch.cli,
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"{batch.doc}, with --algorithm minibatch (default {DEFAULT_BATCH_SIZE})",
    )
    patience = _params.PARAMS["max_no_improvement"]
    parser.add_argument(
        patience.cli,
        type=_int_or_none,
        default=10,
        metavar="N|none",
        help=f"{patience.doc}, with --algorithm minibatch (default 10)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dkmeans", description="Distributed k-means clustering on Dask."
    )
    sub = parser.add_subparsers(dest="command", required=True, help="the command to run")

    fit = sub.add_parser("fit", help="fit k-means on Parquet/CSV and write a model file")
    fit.add_argument("input", help="Parquet file/directory/glob or CSV file/glob")
    fit.add_argument("--model", required=True, help="model file to write (exactly this path)")
    fit.add_argument(
        "--columns", nargs="+", help="columns to cluster on (default: all numeric columns)"
    )
    fit.add_argument("--exclude", nargs="+", help="columns to leave out (e.g. known labels or ids)")
    _add_fit_options(fit)
    fit.add_argument(
        "--plot", help="write the objective history and a 2-D view of the clusters (PNG)"
    )
    fit.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="write the fit's state to PATH as it runs, so a killed job can --resume",
    )
    fit.add_argument(
        "--resume",
        action="store_true",
        help="continue from --checkpoint PATH if it exists (same data and options)",
    )
    fit.add_argument("--quiet", action="store_true", help="no per-iteration progress")
    _storage_arguments(fit)
    _cluster_options(fit)
    fit.set_defaults(handler=_fit)

    sweep = sub.add_parser(
        "sweep",
        help="fit several values of k at once, sharing the passes over the data; "
        "print the objective per k and a suggested k",
    )
    sweep.add_argument("input", help="Parquet file/directory/glob or CSV file/glob")
    sweep.add_argument(
        "-k",
        required=True,
        dest="k_values",
        metavar="VALUES",
        help="values of k: a range lo:hi[:step] (hi included when on the step), a list 2,4,8, "
        "or both: 2:10,16,32",
    )
    sweep.add_argument(
        "--columns", nargs="+", help="columns to cluster on (default: all numeric columns)"
    )
    sweep.add_argument(
        "--exclude", nargs="+", help="columns to leave out (e.g. known labels or ids)"
    )
    _add_fit_options(sweep, SWEEP_OPTIONS, minibatch=False)
    sweep.add_argument(
        "--save-models",
        metavar="DIR",
        help="write the model of every k to DIR/kmeans-k<K>.npz (as dkmeans fit writes them)",
    )
    sweep.add_argument(
        "--method",
        choices=("refit", "bisecting"),
        default="refit",
        help="refit: a k-means fit of every k (default); bisecting: every k "
        "from one bisecting fit, then a k-means fit of the suggested k alone",
    )
    sweep.add_argument(
        "--plot", metavar="FILE", help="write the objective per k, the suggested k marked (PNG)"
    )
    sweep.add_argument("--quiet", action="store_true", help="no per-iteration progress")
    _storage_arguments(sweep)
    _cluster_options(sweep)
    sweep.set_defaults(handler=_sweep)

    _add_bisect_parser(sub)

    predict = sub.add_parser("predict", help="label Parquet/CSV rows with a model; write Parquet")
    predict.add_argument("model", help="model file written by dkmeans fit (or KMeans.save)")
    predict.add_argument("input", help="Parquet file/directory/glob or CSV file/glob to label")
    predict.add_argument(
        "--output", required=True, help="Parquet directory to write (one file per input partition)"
    )
    predict.add_argument(
        "--label-column", default="cluster", help="name of the label column added (default cluster)"
    )
    _missing_argument(predict)
    _storage_arguments(predict)
    _cluster_options(predict)
    predict.set_defaults(handler=_predict)

    evaluate = sub.add_parser(
        "evaluate", help="objective of a model on data; with known labels, accuracy, CI, ARI"
    )
    evaluate.add_argument("model", help="model file written by dkmeans fit (or KMeans.save)")
    evaluate.add_argument("input", help="Parquet file/directory/glob or CSV file/glob to score")
    evaluate.add_argument("--truth-column", help="column of known class labels")
    _missing_argument(evaluate)
    _storage_arguments(evaluate)
    _cluster_options(evaluate)
    evaluate.set_defaults(handler=_evaluate)

    demo = sub.add_parser(
        "demo", help="cluster a few million generated points on a local Dask cluster"
    )
    demo.add_argument(
        "--n-samples",
        type=int,
        metavar="N",
        default=3_000_000,
        help="rows to generate (default 3000000)",
    )
    demo.add_argument(
        "--n-features", type=int, metavar="N", default=8, help="columns of each row (default 8)"
    )
    demo.add_argument(
        "-k", type=int, default=12, help="number of clusters (and of generating blobs; default 12)"
    )
    demo.add_argument(
        "--spread",
        type=float,
        metavar="SD",
        default=2.0,
        help="standard deviation of each blob (default 2.0)",
    )
    demo.add_argument(
        "--chunk-rows",
        type=int,
        metavar="N",
        default=250_000,
        help="rows per chunk of the generated Dask array (default 250000)",
    )
    demo.add_argument(
        "--max-iter", type=int, metavar="N", default=100, help="most Lloyd iterations (default 100)"
    )
    demo.add_argument(
        "--tol",
        type=float,
        default=1e-4,
        help="stop when the centroids' total squared shift is below tol x the mean feature "
        "variance (default 0.0001)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        metavar="N",
        default=0,
        help="seed of the data and of the fit (default 0)",
    )
    demo.add_argument(
        "--output",
        default="dkmeans-demo-output",
        metavar="DIR",
        help="folder for the model, labels and plot (default dkmeans-demo-output)",
    )
    demo.add_argument("--quiet", action="store_true", help="no per-iteration progress")
    _cluster_options(demo)
    demo.set_defaults(handler=_demo)
    warm = sub.add_parser(
        "warm-up",
        help="compile the kernels into numba's disk cache now (once per machine; "
        "later processes load them in a fraction of a second)",
    )
    warm.add_argument(
        "--n-features",
        type=int,
        nargs="+",
        metavar="D",
        default=[2, 4, 8, 16, 32],
        help="widths to compile for (default 2 4 8 16 32; the direct loops have one variant per "
        "width up to 16, one for all wider rows)",
    )
    warm.set_defaults(handler=_warm_up)
    for command in (fit, sweep, predict, evaluate, demo, warm):
        command.add_argument(
            "--json",
            action="store_true",
            help="print the outcome as one JSON line on stdout (everything else on stderr)",
        )
    return parser


def main(argv=None) -> int:
    """Entry point of the ``dkmeans`` console script; returns the exit status.

    0: done. 2: a user error (bad option, unreadable input, data dkmeans refuses; one line on
    stderr). 1: an internal error (one line on stderr naming the file that holds the
    traceback). 143 / 130: stopped by SIGTERM / SIGINT (see :mod:`dkmeans.job_signals`: the
    work stops, a fit with ``--checkpoint`` writes its last iteration there, the cluster is
    closed). With ``--json`` the last line on stdout is the outcome as one JSON object, and
    nothing else is printed on stdout.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    as_json = getattr(args, "json", False)
    restore_logging = _log_to(getattr(args, "quiet", False), to_stderr=as_json)
    real_stdout = sys.stdout
    outcome = {"command": args.command}
    with JobSignals() as signals:
        try:
            with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
                status = _run(args, signals, outcome)
        except JobInterrupted:  # a signal during the cleanup of _run: it is done by now
            status = signals.exit_status
    if as_json:
        outcome.update(status=_STATUS_NAMES.get(status, "interrupted"), exit_status=status)
        if status == 0:
            outcome.update(getattr(args, "summary", None) or {})
        print(json.dumps(outcome, default=str), file=real_stdout, flush=True)
    restore_logging()
    return status


def run(argv=None) -> int:
    """The ``dkmeans`` console script and ``python -m dkmeans``: :func:`main`, then the process ends.

    The objects the command leaves are frozen (:func:`gc.freeze`) once it has closed what it
    opened, so that the interpreter's exit skips collecting them: numba, pyarrow, pandas and
    Dask loaded, that collection took 0.45 s of a 2.7 s command (measured). Only where the
    process ends next: :func:`main` in a longer-lived process (a test, a notebook) freezes
    nothing.
    """
    status = main(argv)
    gc.freeze()
    return status


#: The ``status`` of ``--json`` by exit status (anything else: "interrupted").
_STATUS_NAMES = {0: "done", 1: "internal-error", 2: "error"}


def _run(args, signals, outcome: dict) -> int:
    """Run the command and close what it opened; the exit status (see :func:`main`)."""
    try:
        return args.handler(args)
    except (DKMeansError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"dkmeans: error: {message}", file=sys.stderr)
        outcome["error"] = message
        return 2
    except (JobInterrupted, KeyboardInterrupt) as exc:
        signals.received = signals.received or getattr(exc, "signum", signal.SIGINT)
        outcome["signal"] = signal_name(signals.received)
        hint = _resume_hint(args, outcome)
        print(f"dkmeans: interrupted ({outcome['signal']}){hint}", file=sys.stderr)
        return signals.exit_status
    except Exception as exc:  # a bug: one line here, the traceback in a file
        log = _write_traceback(exc)
        outcome.update(error=f"{type(exc).__name__}: {exc}".splitlines()[0], log=str(log))
        print(
            f"dkmeans: internal error: {outcome['error']} (traceback in {log}; please report it)",
            file=sys.stderr,
        )
        return 1
    finally:
        # a signal now does not cut the close short (the grace period still holds)
        with signals.deferred():
            opened = getattr(args, "opened_client", None)
            if opened is not None:  # --scheduler: disconnect (the scheduler and its workers stay)
                opened.close()
            _close_command_cluster()  # before interpreter shutdown, so it closes quietly


def _close_command_cluster() -> None:
    """Close the embedded cluster, if one was started: not one where the engine's client module
    (the only starter) was never imported, as in a fit in this process (distributed not loaded)."""
    if "dkmeans.engine.client" in sys.modules:
        from dkmeans.fit.cluster import close_command_cluster

        close_command_cluster()


def _resume_hint(args, outcome: dict) -> str:
    """Where an interrupted fit's checkpoint is, when it has one."""
    path = getattr(args, "checkpoint", None)
    if path is None or not Path(path).is_file():
        return ""
    outcome["checkpoint"] = str(path)
    return f"; the fit's state is in {path}: run the same command with --resume to continue"


def _write_traceback(exc: BaseException) -> Path:
    """The traceback of an internal error, in a new file of the temporary folder."""
    import tempfile
    import traceback

    fd, name = tempfile.mkstemp(prefix="dkmeans-error-", suffix=".log")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"dkmeans {__version__}: {' '.join(sys.argv)}\n")
        fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return Path(name)


if __name__ == "__main__":
    sys.exit(run())
