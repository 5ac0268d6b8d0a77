"""The pure core: events, policies, per-job state and decisions; no I/O, time passed in."""
