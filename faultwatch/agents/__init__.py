"""Node side of faultwatch: the agent that wraps a training command and ships its output."""
