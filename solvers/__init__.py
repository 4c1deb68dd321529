"""Scheduling solvers over one :class:`frenzy_opt.problem.SchedulingProblem`: the greedy HAS (online)
and, registered by name in :mod:`frenzy_opt.solvers.base`, the exact ones."""

from frenzy_opt.solvers import cpsat, greedy, lpbound
from frenzy_opt.solvers.base import Solver, make_solver, solver_names

__all__ = ["Solver", "cpsat", "greedy", "lpbound", "make_solver", "solver_names"]
