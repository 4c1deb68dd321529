"""Planning: a job's memory-feasible plans, the scheduling problem, scenarios, workloads and exports."""
