"""What a job's launch says before it runs (pure): its command line and environment as a typed
launch description (`parse(argv, env)`: the launcher, torchrun's options, every timeout with
where it came from), the scheduler's context, and the defaults of each party."""

from faultwatch.launch.model import Launch, Setting, Torchrun
from faultwatch.launch.parse import parse, start_deadline_s

__all__ = ["Launch", "Setting", "Torchrun", "parse", "start_deadline_s"]
