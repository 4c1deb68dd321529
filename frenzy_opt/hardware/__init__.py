"""Hardware: the GPU catalogue, cluster specs (contract 2) and the topology graph."""
