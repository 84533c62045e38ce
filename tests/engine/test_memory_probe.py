"""The workers' memory probe: one round trip, the kernels loaded beside the placement, their memory counted."""

from __future__ import annotations

import numpy as np

from dkmeans.engine import memory
from dkmeans.kernels import plans
from tests.helpers import loaded_after


def _wait_loaded(dtype: str, n_features: int) -> tuple[bool, bool]:
    """Run on a worker: wait for its kernel loads; whether they ended, and whether the kernels are there."""
    for thread in list(memory._loading.values()):
        thread.join(120)
    return (
        not any(t.is_alive() for t in memory._loading.values()),
        (dtype, n_features) in memory._prepared,
    )


def test_the_probe_starts_the_kernel_load_and_counts_its_memory(client):
    """A compiled plan's kernels are loaded in a thread of each worker; the budget counts their
    memory while the load runs, and a second probe finds them loaded (nothing counted twice)."""
    plan = plans.KernelPlan("compiled", "auto")  # sent as its fields, as the budget does
    width = 3  # the tests' usual width: its kernels are in numba's cache (a load, not a compile)
    first = client.run(memory._probe_worker, tuple(plan), np.float64, width)
    assert len(first) == 2
    counted = memory._counted_rss(first)
    for address, (loaded, rss, loading) in first.items():
        assert loaded != loading and rss > 0  # loaded by an earlier fit, or loading now
        assert counted[address] == rss + (memory.KERNELS_BYTES if loading else 0)
    assert set(client.run(_wait_loaded, "float64", width).values()) == {(True, True)}
    again = client.run(memory._probe_worker, tuple(plan), np.float64, width)
    assert all(loaded and not loading for loaded, _, loading in again.values())
    assert memory._counted_rss(again) == {a: rss for a, (_, rss, _) in again.items()}
    budget = memory.MemoryBudget.of(client, kernels=(plan, np.dtype(np.float64), width))
    assert budget.plan == plan and set(budget.limits) == set(first)


def test_the_caller_loads_its_own_kernels_beside_the_workers(client):
    """The probe of a compiled plan also starts loading, in a thread of this process, the kernels
    the fit runs here (the seeding's swap loops and the assignment loops); it changes no plan:
    the size rule's record of loaded kernels stays as it was."""
    from dkmeans.kernels.backends import compiled_swap

    plan = plans.KernelPlan("compiled", "auto")
    width = 5
    recorded = plans.loaded(np.float32, width)
    budget = memory.MemoryBudget.of(client, kernels=(plan, np.dtype(np.float32), width))
    assert budget.plan == plan
    thread = memory._loading[("caller", tuple(plan), "float32", width)]
    thread.join(300)
    assert not thread.is_alive()
    assert compiled_swap.swap_costs_rows.overloads and compiled_swap.swap_partials_rows.overloads
    assert plans.loaded(np.float32, width) == recorded
    memory.MemoryBudget.of(client, kernels=(plan, np.dtype(np.float32), width))
    assert memory._loading[("caller", tuple(plan), "float32", width)] is thread  # once


def test_a_numpy_plan_loads_nothing(client):
    state = client.run(memory._probe_worker, ("numpy", "numpy"), np.float32, 5)
    assert not any(loading for _, _, loading in state.values())


def test_a_worker_without_room_narrows_the_plan_to_numpy():
    """The room check reads the probe's answers: a worker whose memory and the kernels' would pass
    its pause threshold makes the plan NumPy; loaded workers always have room."""
    limit = 1000 * 2**20
    info = {"a": {"memory_limit": limit}, "b": {"memory_limit": limit}}
    tight = int(0.8 * limit) - memory.KERNELS_BYTES + 1
    assert memory._room_for_kernels(
        None, info, "float32", 4, {"a": (False, 10, True), "b": (True, tight, False)}
    )
    assert not memory._room_for_kernels(
        None, info, "float32", 4, {"a": (False, 10, True), "b": (False, tight, False)}
    )


def test_a_fresh_worker_answers_the_probe_without_importing_the_engine():
    """The probe's module imports neither Dask's array collection nor the kernels (what a fresh
    worker would import before its answer: about 2 s on 2 cores); the engine's names still resolve."""
    heavy = loaded_after(
        "import dkmeans.engine.probe",
        ("dask.array", "dkmeans.kernels", "numba", "dkmeans.engine.persisted"),
        then=(
            "from dkmeans.engine import MemoryBudget, PersistedData, gather\n"
            "found = (MemoryBudget.__module__, PersistedData.__module__, gather.__module__)\n"
            "assert found == ('dkmeans.engine.memory', 'dkmeans.engine.persisted',"
            " 'dkmeans.engine.futures'), found"
        ),
    )
    assert heavy == []
