"""Actuators: make schedulers act on decisions and the node registry (Slurm, Kubernetes, exec)."""
