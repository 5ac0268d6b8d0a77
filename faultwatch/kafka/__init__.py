"""Kafka plumbing both sides use: security settings, the one client factory, the one
broker-error translator, topic creation, topic readers, a local broker (plain or locked
down: secure_broker) and the roles' ACLs (acls, acl_admin)."""
