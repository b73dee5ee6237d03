"""Sluicegate's Python SDK (being built: see the SDK issue)."""
