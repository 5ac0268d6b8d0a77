"""Notifications: decisions grouped the way Alertmanager groups, sent to chat webhooks."""
