"""Per-chunk array kernels: pure functions of NumPy or CuPy arrays, no Dask inside."""

from dkmeans.kernels.nearest import (
    DEFAULT_SCRATCH_BYTES,
    Partials,
    TopRows,
    assign,
    assign_partials,
    distances,
    farthest_points,
    plan_tiles,
)
from dkmeans.kernels.reduce import combine_partials, combine_top, update_centroids

__all__ = [
    "DEFAULT_SCRATCH_BYTES",
    "TopRows",
    "Partials",
    "assign",
    "assign_partials",
    "distances",
    "combine_top",
    "combine_partials",
    "farthest_points",
    "plan_tiles",
    "update_centroids",
]

from dkmeans.kernels.plans import KernelPlan, plan  # noqa: E402
from dkmeans.kernels.sampling import random_top_rows, uniform_by_index  # noqa: E402
from dkmeans.kernels.stats import Moments, column_moments, combine_moments  # noqa: E402

__all__ += ["KernelPlan", "plan"]
__all__ += ["Moments", "column_moments", "combine_moments", "random_top_rows", "uniform_by_index"]

from dkmeans.kernels.backends.sparse import take_rows  # noqa: E402
from dkmeans.kernels.nearest import cluster_sums, select_top  # noqa: E402
from dkmeans.kernels.seeding import (  # noqa: E402
    Nearest,
    TrialPartial,
    candidate_weights,
    kpp_trials,
    objectives,
    oversample_scores,
    random_partition_partials,
    rows_above,
    sq_distances,
    update_nearest,
    weighted_lloyd,
)

__all__ += [
    "Nearest",
    "TrialPartial",
    "candidate_weights",
    "cluster_sums",
    "objectives",
    "kpp_trials",
    "oversample_scores",
    "random_partition_partials",
    "rows_above",
    "select_top",
    "sq_distances",
    "take_rows",
    "update_nearest",
    "weighted_lloyd",
]

from dkmeans.kernels.swap import (  # noqa: E402
    CandidateSample,
    NearestTwo,
    SplitSums,
    SwapCosts,
    TrialPartials,
    combine_candidate_samples,
    combine_split_sums,
    combine_swap_costs,
    combine_trial_partials,
    nearest_two,
    sample_by_cost,
    split_sums,
    swap_costs,
    swap_partials,
)

__all__ += [
    "CandidateSample",
    "NearestTwo",
    "SplitSums",
    "SwapCosts",
    "TrialPartials",
    "combine_candidate_samples",
    "combine_split_sums",
    "combine_swap_costs",
    "combine_trial_partials",
    "nearest_two",
    "sample_by_cost",
    "split_sums",
    "swap_costs",
    "swap_partials",
]
