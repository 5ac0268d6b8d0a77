"""The fleet-wide node registry: pure core, Kafka store, writer and CLI (records in wire)."""
