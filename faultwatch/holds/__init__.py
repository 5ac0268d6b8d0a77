"""Operators' holds and mutes of jobs: the followers' table, the Kafka follower and the
command side (the pure model is core/holds.py, the record wire/holds.py)."""
