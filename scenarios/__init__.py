"""Shipped scenarios: clusters and workloads used by the CLI, the demo, the tests and the benchmarks."""
