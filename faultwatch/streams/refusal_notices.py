"""Telling an agent why its records are refused: when the matcher refuses a logs record for its
node signature (no node key, a key the trust file does not list, another node's key), the
processor sends that job's agents a signed `notify` of kind `records-refused` on the control
topic, naming the node, the reason and what to do. The agent keeps it and says it in its
closing line: an agent whose every record is dead-lettered otherwise ends with exit 77
("no decision arrived") and no hint.

Bounded: at most one notice per (job, node) every NOTICE_EVERY_S, at most MAX_PER_S a second
for the worker, and at most MAX_PAIRS (job, node) pairs remembered (the oldest forgotten)."""

from __future__ import annotations

from faultwatch.core.decide import decision_id
from faultwatch.core.events import Decision
from faultwatch.trust.keys import NODE_KEY_FILE_ENV, TRUST_FILE_ENV
from faultwatch.trust.records import WRONG_ROLE
from faultwatch.trust.refusals import REFUSED_KIND
from faultwatch.wire.signing import BAD_SIGNATURE, MALFORMED, UNKNOWN_KEY, UNSIGNED

NOTICE_EVERY_S = 60.0
MAX_PER_S = 10
MAX_PAIRS = 10_000

HINTS = {
    UNSIGNED: (f"this agent signs nothing: give it its node key ({NODE_KEY_FILE_ENV}, made by "
               "`faultwatch keys generate --node NODE`) and add the key's line to the "
               f"processors' trust file ({TRUST_FILE_ENV})"),
    UNKNOWN_KEY: ("the processors' trust file does not list this node key: add its line "
                  "(`faultwatch keys show KEYFILE` prints it) and restart them"),
    WRONG_ROLE: "a node's records must be signed with a node key, not an operator's or a "
                "processor's",
    "wrong_node": "the key belongs to another node: give the agent this node's own key "
                  "(--node must be the name its trust-file line gives)",
    BAD_SIGNATURE: "the signature does not match the record: the record was altered on the "
                   "way, or another key was used",
    MALFORMED: "the signature headers are malformed (a different faultwatch version?)",
}


class RefusalNotices:
    """`take(...)` -> a notice to send, or None while that node was told recently."""

    def __init__(self, every_s: float = NOTICE_EVERY_S, max_per_s: int = MAX_PER_S,
                 max_pairs: int = MAX_PAIRS) -> None:
        self.every_s, self.max_per_s, self.max_pairs = every_s, max_per_s, max_pairs
        self.told: dict[tuple[str, str], float] = {}  # (job, node) -> last notice
        self._second = (0, 0)  # (the current second, notices sent in it)
        self.sent = 0

    def take(self, about: tuple[str, str, int, str], reason: str, detail: str, now: float,
             rules_version: str = "") -> Decision | None:
        job, node, attempt, run_id = about
        last = self.told.get((job, node))
        if last is not None and 0 <= now - last < self.every_s:
            return None
        second, n = self._second
        if int(now) == second and n >= self.max_per_s:
            return None
        self._second = (int(now), n + 1 if int(now) == second else 1)
        self.told.pop((job, node), None)
        self.told[(job, node)] = now
        while len(self.told) > self.max_pairs:
            del self.told[next(iter(self.told))]
        self.sent += 1
        hint = HINTS.get(reason, "see the processor's log (event=dead_letter)")
        return Decision(
            id=decision_id(job, attempt, REFUSED_KIND, f"{node}:{int(now // self.every_s)}",
                           run_id),
            job=job, attempt=attempt, action="notify", kind=REFUSED_KIND, ts=now,
            nodes=(node,), message=f"the processors refuse the records of node {node} "
                                   f"({reason}): {detail}; {hint}",
            evidence={"node": node, "reason": reason, "detail": detail[:300], "hint": hint},
            rules_version=rules_version, run_id=run_id)
