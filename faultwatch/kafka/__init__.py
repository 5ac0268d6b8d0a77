"""Kafka plumbing both sides use: security settings, the one client factory, the one
broker-error translator, topic creation, topic readers and a local broker."""
