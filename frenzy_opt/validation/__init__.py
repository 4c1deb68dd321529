"""Validation of MARP against measured peak memory (CPU FakeTensorMode + MemTracker, GPU runs)."""
