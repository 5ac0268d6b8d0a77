"""Diagnosing a hang from what the ranks are doing: Flight Recorder dumps and Python stacks."""
