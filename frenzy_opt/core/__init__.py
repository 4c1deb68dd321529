"""Core vocabulary: the job spec (contract 1) and this machine."""
