"""MARP: the memory-aware resource predictor (per-stage peak memory of a training step)."""
