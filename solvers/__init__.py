"""Scheduling solvers (greedy HAS, CP-SAT, PuLP bound, baselines): see issue 3; nothing is registered yet."""
