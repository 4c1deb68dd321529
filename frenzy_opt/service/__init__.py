"""Service state: the orchestrator (GPU ledger, job lifecycle, decisions, launches) and the durable job store."""
