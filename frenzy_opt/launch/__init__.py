"""Launch: executors (local torchrun, Ray, simulated), the launcher and the training worker."""
