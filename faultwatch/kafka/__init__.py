"""Kafka plumbing both sides use: the roles' ACLs, the locked-down local broker."""
