"""The greedy's fast pricing through shape books (solvers/greedy_index.py) against the plain pricing
(``GreedyState._price``), a consistency check of two implementations of the same rule: on random instances
(several GPU types, jobs queued at once and arriving, occupancy, priorities, deadlines, admission, patient and
impatient), both make the same decision at every event, GPU for GPU and second for second, and plan the same
waits."""

from __future__ import annotations

from factories import synthetic_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzy_opt.hardware.cluster import parse_cluster
from frenzy_opt.hardware.topology import Topology
from frenzy_opt.planning.problem import Busy, Option, ProblemJob, SchedulingProblem
from frenzy_opt.solvers.greedy import GreedyHAS, GreedyState
from frenzy_opt.solvers.greedy_index import RankOrder

TYPES = ("A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-32GB")
NODE = 4  # GPUs per node: small nodes so that whole-node shapes, fragments and reservations all occur
TOPOLOGY = Topology(
    parse_cluster(
        {"node_groups": [{"gpu": gpu, "num_nodes": 3, "gpus_per_node": NODE} for gpu in TYPES]}  # 36 GPUs
    )
)
SHAPES = (1, 2, 3, 4, 8, 12)


@st.composite
def options(draw: st.DrawFn) -> tuple[Option, ...]:
    picked = draw(
        st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from(SHAPES)), min_size=1, max_size=6, unique=True)
    )
    out = []
    for gpu_type, num_gpus in picked:
        duration = float(draw(st.integers(1, 400)) * 10)
        plan = synthetic_plan(gpu_type, num_gpus, duration)
        whole = num_gpus // NODE if num_gpus > NODE else 0
        out.append(Option(gpu_type=gpu_type, num_gpus=num_gpus, whole_nodes=whole, duration_s=duration, plan=plan))
    return tuple(out)


@st.composite
def jobs(draw: st.DrawFn) -> list[ProblemJob]:
    count = draw(st.integers(1, 40))
    out = []
    for i in range(count):
        at_once = draw(st.booleans())
        out.append(
            ProblemJob(
                id=f"j{i:02d}",
                arrival_s=0.0 if at_once else float(draw(st.integers(0, 3000))),
                # weights whose sums are exact in binary floating point, as the decision order's sums assume
                weight=draw(st.sampled_from((0.5, 1.0, 2.0, 3.0))),
                options=draw(options()),
                priority=draw(st.sampled_from((0, 0, 0, 1))),
                deadline_s=draw(st.one_of(st.none(), st.integers(100, 6000).map(float))),
            )
        )
    return out


class _Quota:
    """Admission that refuses one GPU type to the jobs of even number."""

    def __init__(self, refused_type: str) -> None:
        self.refused_type = refused_type

    def allows(self, job: str, option: Option) -> bool:
        return not (int(job[1:]) % 2 == 0 and option.gpu_type == self.refused_type)

    def take(self, job: str, option: Option) -> None:
        pass


def _replay(problem: SchedulingProblem, fast: bool, patient: bool, quota: _Quota | None) -> list[tuple[object, ...]]:
    """Every decision of an online replay (arrivals and completions) with what it waits for."""
    state = GreedyState(problem, fast=fast, patient=patient)
    arrivals = sorted(problem.jobs, key=lambda j: (j.arrival_s, j.id))
    log: list[tuple[object, ...]] = []
    i = 0
    while i < len(arrivals) or state.queue:
        next_arrival = arrivals[i].arrival_s if i < len(arrivals) else float("inf")
        now = min(next_arrival, state.running[0][0] if state.running else float("inf"))
        if now == float("inf"):
            break  # nothing left can start (an option larger than its type)
        state.complete_until(now)
        while i < len(arrivals) and arrivals[i].arrival_s <= now:
            state.queue[arrivals[i].id] = arrivals[i]
            i += 1
        started = state.decide(now, admit=quota)
        log.append((now, [(a.job, a.option, a.nodes, a.start_s, a.end_s) for a in started], dict(state.waiting)))
        if not started and not state.running and i == len(arrivals):
            break  # what is left never fits
    return log


@settings(max_examples=60, deadline=None)
@given(
    jobs(),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from(TYPES)),
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, NODE), st.integers(10, 2000)), max_size=5),
)
def test_fast_pricing_makes_the_plain_pricings_decisions(
    queue: list[ProblemJob], patient: bool, refused: str | None, held: list[tuple[int, int, int]]
) -> None:
    busy, left = [], {n: NODE for n in range(len(TOPOLOGY.nodes))}
    for node, gpus, until in held:
        take = min(gpus, left[node])
        if take:
            busy.append(Busy(node=node, num_gpus=take, until_s=float(until)))
            left[node] -= take
    problem = SchedulingProblem(topology=TOPOLOGY, jobs=tuple(queue), busy=tuple(busy))
    quota = None if refused is None else _Quota(refused)
    plain = _replay(problem, fast=False, patient=patient, quota=quota)
    fast = _replay(problem, fast=True, patient=patient, quota=quota)
    assert fast == plain
    assert any(started for _, started, _ in plain) or not queue or refused is not None or busy


def test_the_replay_solver_is_the_same_either_way() -> None:
    """``frenzy solve``'s greedy on a deep queue queued at once: the same schedule with either pricing."""
    queue = [
        ProblemJob(
            id=f"j{i:03d}",
            arrival_s=0.0,
            weight=1.0 + i % 2,
            options=tuple(
                Option(
                    gpu_type=gpu,
                    num_gpus=n,
                    whole_nodes=n // NODE if n > NODE else 0,
                    duration_s=float(100 + (37 * i + 11 * n + 7 * k) % 900),
                    plan=synthetic_plan(gpu, n, 1.0),
                )
                for k, gpu in enumerate(TYPES)
                for n in (1, 2, 4, 8)
            ),
        )
        for i in range(150)
    ]
    problem = SchedulingProblem(topology=TOPOLOGY, jobs=tuple(queue))
    plain, fast = GreedyHAS(fast=False).solve(problem), GreedyHAS().solve(problem)
    assert len(plain.assignments) == 150
    assert fast.assignments == plain.assignments


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=80))
def test_rank_order_is_a_sorted_list_of_what_is_queued(steps: list[tuple[bool, int]]) -> None:
    order, queued = RankOrder(), {}
    for put, n in steps:
        job_id = f"j{n:02d}"
        if put:
            job = ProblemJob(id=job_id, arrival_s=float(n % 7), weight=1.0, options=())
            queued[job_id] = job
            order.put((0.0, -float(n % 5), float(n % 7), job_id), job)
        else:
            queued.pop(job_id, None)
            order.drop(job_id)
        assert [j.id for j in order.jobs] == sorted(queued, key=lambda i: (-float(int(i[1:]) % 5), int(i[1:]) % 7, i))
        assert order.keys == sorted(order.keys)
