"""The service's routes, one router per concern: jobs, the dry run, the cluster and its history, operations."""
