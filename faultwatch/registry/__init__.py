"""The fleet's node registry (the operators' and processors' view of nodes, not the node side):
around the pure model core/registry.py, its Kafka store and follower, the signature gate, the
processor's writer, node checks and operators' manual quarantines (records in wire/tables)."""
