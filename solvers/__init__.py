"""Scheduling solvers over one :class:`frenzy_opt.planning.problem.SchedulingProblem` — the greedy HAS (online) and,
registered by name in :mod:`frenzy_opt.solvers.base`, the exact ones — and the simulator's policies
(:mod:`frenzy_opt.solvers.policies`: frenzy, fifo, optimal; sia; gavel)."""

from frenzy_opt.solvers import cpsat, gavel, greedy, lpbound, policies, sia
from frenzy_opt.solvers.base import Solver, make_solver, solver_names
from frenzy_opt.solvers.policies import make_policy, policy_names

__all__ = [
    "Solver",
    "cpsat",
    "gavel",
    "greedy",
    "lpbound",
    "make_policy",
    "make_solver",
    "policies",
    "policy_names",
    "sia",
    "solver_names",
]
