"""The fleet-wide node registry: pure core (registry), records, Kafka store and CLI."""
