"""Strict patterns for the names actuators pass to schedulers: nodes, job ids, decision ids."""

from __future__ import annotations

import re

from faultwatch.core.names import MAX_NAME_CHARS, name_problem
from faultwatch.errors import ConfigError

# Slurm node names and Kubernetes node names (DNS subdomains): letters, digits, '.', '-', '_';
# never starting with '-' (it would read as an option), at most 253 characters.
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
SLURM_JOB_ID_RE = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,12})?")  # 123 or array 123_4
DECISION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
RULE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
K8S_NAMESPACE_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
K8S_NAME_RE = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
K8S_UID_RE = re.compile(r"[0-9a-fA-F-]{1,64}")
# Slurm reads `all` (any case) as every node: `scontrol update nodename=all state=drain`
# drained both nodes of the test cluster. Ranges (`n[1-9]`) and lists (`a,b`, `a b`) are
# refused by NODE_RE already.
MULTI_NODE_WORDS = frozenset({"all"})


def check(kind: str, value: object, pattern: re.Pattern[str]) -> str:
    """`value` if it fully matches `pattern`, else ConfigError naming the field and value."""
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ConfigError(kind, f"invalid value {value!r:.80} (must match {pattern.pattern})")
    return value


def valid_node(node: object) -> str:
    """A node name a scheduler reads as exactly one node."""
    name = check("node", node, NODE_RE)
    if name.lower() in MULTI_NODE_WORDS:
        raise ConfigError("node", f"{name!r} names every node to Slurm; refused")
    return name


def valid_job(job: object, field: str = "job") -> str:
    """A job name by the one rule for names (core/names.py, which the agent's records pass
    through wire's safe_name too). Actuators pass it as one whole argument value
    (`squeue --name=JOB`, an exec template's placeholder), never a shell."""
    problem = name_problem(job)
    if problem is not None or not isinstance(job, str):
        raise ConfigError(field, f"invalid job name {job!r:.80}: {problem} (1-{MAX_NAME_CHARS} "
                                 "characters, no control characters)")
    return job
