"""frenzy-opt: memory-aware, heterogeneity-aware scheduling of LLM training jobs on mixed GPU clusters."""

__version__ = "0.1.0"
