"""The trust policy a processor worker announces (on its status-topic record), and the check an
operator's command makes against it before it writes: a rule set, node record or hold that
the verifying workers would refuse is refused by the command itself (exit 8), never printed
as a success that only the processors' logs contradict.

Announced, per worker: `{"verifies": ["rules", "node", "hold", "logs"], "keys":
{"operator": [key ids], "processor": [key ids]}, "node_keys": N}` (`verifies` is empty
without a trust file: that worker takes anything). Key ids only, never keys; node keys are
counted, not listed (a fleet has thousands).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch import settings
from faultwatch.trust.keys import NODE, OPERATOR, PROCESSOR, TrustSet
from faultwatch.trust.records import HOLD, NODE_RECORD, RULES, SIGNERS

# what a worker verifies with a trust file: the operator-written purposes, and the agents'
# records when the file lists node keys
OPERATOR_WRITES = (RULES, NODE_RECORD, HOLD)
WHAT = {RULES: "rule set", NODE_RECORD: "node record", HOLD: "hold"}


def announcement(trust: TrustSet | None) -> dict[str, Any]:
    """What a worker holding `trust` (None: no trust file) says of its policy."""
    if trust is None:
        return {"verifies": [], "keys": {}, "node_keys": 0}
    nodes = len(trust.of_role(NODE))
    return {"verifies": [*OPERATOR_WRITES, *(["logs"] if nodes else [])],
            "keys": {role: sorted(k.key_id for k in trust.of_role(role))
                     for role in (OPERATOR, PROCESSOR)},
            "node_keys": nodes}


@dataclass
class WriteCheck:
    """The live workers' verdict on a write: who would refuse it (worker -> why), who says
    nothing of its policy (an older worker), and how many were asked."""

    purpose: str
    refusing: dict[str, str] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    workers: int = 0

    @property
    def refused(self) -> bool:
        return bool(self.refusing)

    def message(self, key_id: str | None) -> str:
        """Why the write is refused, and how to make one they accept."""
        what = WHAT.get(self.purpose, self.purpose)
        names = sorted(self.refusing)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        roles = "/".join(SIGNERS.get(self.purpose, (OPERATOR,)))
        signer = ("an " if roles[0] in "aeiou" else "a ") + roles
        if key_id is None:
            return (f"{len(names)} of {self.workers} processor worker(s) verify {what}s "
                    f"against a trust file and would refuse this unsigned one ({shown}). "
                    f"Sign it: --signing-key-file KEY or ${settings.SIGNING_KEY_FILE}, "
                    f"{signer} key listed in their trust file (`faultwatch keys generate "
                    "--role operator`, docs/operating.md \"Keys and trust\")")
        return (f"{len(names)} of {self.workers} processor worker(s) would refuse a {what} "
                f"signed by key {key_id}: {self.refusing[names[0]]} ({shown}). Use "
                f"{signer} key of their trust file, or add this key's line to it "
                f"(`faultwatch keys show KEYFILE` prints it) and restart them")


def check_write(purpose: str, key_id: str | None, workers: Mapping[str, Mapping[str, Any]]
                ) -> WriteCheck:
    """Would the live `workers` (name -> announced record) accept a `purpose` record signed
    by `key_id` (None: unsigned)? A worker without a trust file takes it; one that verifies
    takes it only from a key its trust file lists for a role that may sign it."""
    out = WriteCheck(purpose, workers=len(workers))
    for name, rec in workers.items():
        policy = rec.get("trust")
        if not isinstance(policy, Mapping):
            out.silent.append(name)
            continue
        if purpose not in (policy.get("verifies") or ()):
            continue
        if key_id is None:
            out.refusing[name] = "unsigned"
            continue
        keys = policy.get("keys") or {}
        if not any(key_id in (keys.get(role) or ()) for role in SIGNERS[purpose]):
            out.refusing[name] = (f"its trust file does not list the key for "
                                  f"{'/'.join(SIGNERS[purpose])}")
    return out
