"""Scheduling solvers over one :class:`frenzy_opt.planning.problem.SchedulingProblem` — the greedy HAS (online),
CP-SAT and the LP bound (offline) — and the simulator's policies (frenzy, fifo, optimal; sia; gavel). Nothing
is imported here: :mod:`frenzy_opt.solvers.base` finds each by name and imports its module on first use."""

from frenzy_opt.solvers.base import make_policy, make_solver, policy_names, solver_names

__all__ = ["make_policy", "make_solver", "policy_names", "solver_names"]
