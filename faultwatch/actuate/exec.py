"""exec actuator: run an argv template per action, filled with validated decision fields
(never a shell: each template element is one argument, placeholders fill whole values)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from faultwatch.actuate.backend import ActuateError, Option
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.errors import ConfigError

FIELDS = ("node", "decision", "rule", "job", "job_id", "namespace", "pod", "kind")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

PERMANENT_EXITS = range(64, 79)  # sysexits.h EX_USAGE..EX_CONFIG: a retry changes nothing

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def parse_template(flag: str, text: str | None) -> tuple[str, ...] | None:
    """A JSON list of strings, e.g. '["/usr/local/bin/drain", "{node}", "{decision}"]'."""
    if text is None:
        return None
    try:
        argv = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ConfigError(flag, f"not a JSON list of strings: {e}") from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError(flag, "must be a non-empty JSON list of strings")
    for a in argv:
        for name in _PLACEHOLDER.findall(a):
            if name not in FIELDS:
                raise ConfigError(flag, f"unknown placeholder {{{name}}} in {a!r}; "
                                        f"known: {', '.join(FIELDS)}")
    if _PLACEHOLDER.search(argv[0]):
        raise ConfigError(flag, "the program (first element) cannot be a placeholder")
    return tuple(argv)


def fill(template: tuple[str, ...], action: Action) -> list[str] | None:
    """The argv for an action; None when the template needs a field the action lacks.
    Every value was checked against a strict pattern when the action was planned."""
    values = {"node": action.node, "decision": action.decision, "rule": action.rule,
              "job": action.job, "kind": action.kind,
              "job_id": action.scheduler.get("job_id", ""),
              "namespace": action.scheduler.get("namespace", ""),
              "pod": action.scheduler.get("pod", "")}
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        v = values.get(m.group(1), "")
        if not v:
            missing.append(m.group(1))
        return v

    argv = [_PLACEHOLDER.sub(sub, a) for a in template]
    return None if missing else argv


class ExecBackend:
    """Runs `--exec-quarantine`, `--exec-release`, `--exec-requeue` templates."""

    name = "exec"

    def __init__(self, templates: dict[str, tuple[str, ...] | None], timeout_s: float = 60.0,
                 runner: Runner = subprocess.run) -> None:
        if not any(v for k, v in templates.items() if k != "confirm"):
            raise ConfigError("--backend exec", "give at least one of --exec-quarantine, "
                                                "--exec-release, --exec-requeue")
        self.templates, self.timeout_s, self._run = templates, timeout_s, runner

    def apply(self, action: Action) -> str:
        tpl = self.templates.get(action.kind)
        if tpl is None:
            return f"no --exec-{action.kind} template"
        argv = fill(tpl, action)
        if argv is None:
            return f"skipped: the {action.kind} template needs fields this decision lacks"
        try:
            r = self._run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                          check=False, shell=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ActuateError(f"exec {argv[0]}: {e}") from None
        if r.returncode != 0:  # 64-78 (sysexits: usage, no input, no permission...): final
            raise ActuateError(f"exec {argv[0]} exited {r.returncode}: "
                               f"{(r.stderr or '').strip()[:300]}",
                               permanent=r.returncode in PERMANENT_EXITS)
        return f"ran {argv[0]} ({action.kind} {action.node})"


NAME = "exec"
TITLE = ("exec (JSON argv lists; placeholders {node} {decision} {rule} {job} {job_id} "
         "{namespace} {pod} {kind})")
OPTIONS = (Option("--exec-quarantine", metavar="JSON"),
           Option("--exec-release", metavar="JSON"),
           Option("--exec-requeue", metavar="JSON"),
           Option("--exec-confirm", "asked before a node is drained for a job: exit 0 if the "
                  "scheduler runs {job} ({job_id}/{pod}) on {node}, 1 if not", metavar="JSON"))


def build(opts: Mapping[str, Any]) -> ExecBackend:
    return ExecBackend({QUARANTINE: parse_template("--exec-quarantine", opts["exec_quarantine"]),
                        RELEASE: parse_template("--exec-release", opts["exec_release"]),
                        REQUEUE: parse_template("--exec-requeue", opts["exec_requeue"]),
                        "confirm": parse_template("--exec-confirm", opts["exec_confirm"])})
