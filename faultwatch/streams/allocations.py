"""The processor asks the scheduler which nodes a job holds (core/membership.py), as actuate
asks it before a drain (actuate/confirm.py): `faultwatch process --allocation-check
slurm|kubernetes|exec`. Answers are kept a while and handed to the job stage for the batch
that needs them; the scheduler is asked off the event loop, a few questions at a time.

    slurm       `scontrol show job ID -o`: a job RUNNING, COMPLETING, CONFIGURING or SUSPENDED
                holds its NodeList (`scontrol show hostnames`); any other state, or an id Slurm
                does not know: no node
    kubernetes  the pods of the Job uid in the namespace (label
                batch.kubernetes.io/controller-uid, else controller-uid), not finished: their
                nodes and pod names; without a uid, the one pod the run-start names
    exec        --allocation-exec ARGV ({kind} {job_id} {namespace} {uid} {pod}):
                prints the job's nodes (whitespace or commas) and exits 0; exit 1: the
                scheduler runs no such job; anything else: it could not be asked

A question the scheduler could not answer (an error, a timeout) leaves the run unchecked
(`allocation_unavailable`, counted): the processor keeps watching the job, and actuate still
confirms before it drains. Bounded: at most MAX_KEYS answers kept (oldest first out), at
most CONCURRENCY questions at once, each within timeout_s.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from faultwatch.core.events import RunStart
from faultwatch.core.membership import ASK_TIMEOUT_S, allocation_key
from faultwatch.errors import ConfigError, FaultwatchError
from faultwatch.eventlog import Quiet, log_event
from faultwatch.registry.names import (
    K8S_NAME_RE,
    K8S_NAMESPACE_RE,
    K8S_UID_RE,
    SLURM_JOB_ID_RE,
    check,
)
from faultwatch.wire import Tick, decode_signals, job_key

KINDS = ("slurm", "kubernetes", "exec")
HOLDING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT")
ANSWER_TTL_S = 30.0  # an answer is asked again after this long
REFRESH_S = 2.0  # ... or sooner, once this old, when a node it lacks starts the job
RETRY_S = 15.0  # a question that failed is asked again after this long
MAX_KEYS = 10_000
CONCURRENCY = 4
UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
EXEC_FIELDS = ("kind", "job_id", "namespace", "uid", "pod")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

Ask = Callable[[str], frozenset[str]]  # key -> the nodes; raises when it cannot be answered
Peek = Callable[[bytes, int], Any]  # (job key, partition) -> its JobState or None


class Unanswered(FaultwatchError):
    """The scheduler could not be asked (logged, the run stays unchecked)."""


@dataclass
class Entry:
    nodes: frozenset[str] | None  # None: the question failed
    at: float


class Allocations:
    """Answers by allocation key (core/membership.allocation_key), with their age."""

    def __init__(self, ask: Ask, kind: str, timeout_s: float = ASK_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ask, self.kind, self.timeout_s, self.clock = ask, kind, timeout_s, clock
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.asked = self.failed = 0
        self.log = Quiet(log_event, {"allocation_unavailable"}, interval_s=60.0)
        self._sem = asyncio.Semaphore(CONCURRENCY)

    def due(self, wanted: Iterable[tuple[str, str]]) -> list[str]:
        """The keys of (key, node) pairs whose answer is missing, old, or lacks that node."""
        now = self.clock()
        out: dict[str, None] = {}
        for key, node in wanted:
            e = self.entries.get(key)
            if e is None:
                out[key] = None
            elif e.nodes is None:
                if now - e.at >= RETRY_S:
                    out[key] = None
            elif now - e.at >= ANSWER_TTL_S or (node not in e.nodes and now - e.at >= REFRESH_S):
                out[key] = None
        return list(out)

    async def prepare(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Ask the scheduler about what `wanted` needs (concurrently, bounded)."""
        keys = self.due(wanted)
        if keys:
            await asyncio.gather(*(self._one(k) for k in keys))

    async def _one(self, key: str) -> None:
        async with self._sem:
            self.asked += 1
            try:
                nodes: frozenset[str] | None = await asyncio.wait_for(
                    asyncio.to_thread(self.ask, key), self.timeout_s)
            except Exception as e:  # noqa: BLE001 - an unanswered question: the run is unchecked
                self.failed += 1
                nodes = None
                why = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
                self.log("allocation_unavailable", reason=why, key=key, scheduler=self.kind,
                         error=str(e)[:300] or why,
                         note="the run is not checked against its allocation until the "
                              "scheduler answers")
        self.put(key, nodes)

    def put(self, key: str, nodes: frozenset[str] | None) -> None:
        prev = self.entries.get(key)
        if nodes is None and prev is not None and prev.nodes is not None:
            prev.at = self.clock() - ANSWER_TTL_S + RETRY_S  # keep the last answer a while
            return
        self.entries[key] = Entry(nodes, self.clock())
        self.entries.move_to_end(key)
        while len(self.entries) > MAX_KEYS:
            self.entries.popitem(last=False)

    def answers(self, wanted: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
        """The answers held for the keys of `wanted` (the job stage's view for a batch)."""
        out: dict[str, frozenset[str]] = {}
        for key, _ in wanted:
            e = self.entries.get(key)
            if e is not None and e.nodes is not None:
                out[key] = e.nodes
        return out

    async def for_batch(self, wanted: Sequence[tuple[str, str]]) -> dict[str, frozenset[str]]:
        """Ask what `wanted` needs, then the answers for it ({} when it is empty)."""
        if not wanted:
            return {}
        await self.prepare(wanted)
        return self.answers(wanted)


def requests(records: Iterable[Any], peek: Peek) -> list[tuple[str, str]]:
    """(allocation key, node) of each run-start in a batch of signals records: the job its
    scheduler identity names, and the job of the run it would join or replace when that run
    was checked (`peek`: the job stage's state of a job)."""
    out: list[tuple[str, str]] = []
    for rec in records:
        if not rec.value or b'"t":"start"' not in rec.value:
            continue
        try:
            sigs = decode_signals(rec.value)
        except Exception:  # noqa: BLE001 - the job stage dead-letters it
            continue
        if isinstance(sigs, Tick):
            continue
        for sig in sigs:
            if not isinstance(sig, RunStart):
                continue
            key = allocation_key(sig.scheduler)
            if key is not None:
                out.append((key, sig.node))
            st = peek(job_key(sig.job), rec.partition)
            run_key = allocation_key(st.scheduler) if st is not None \
                and st.allocation is not None else None
            if run_key is not None and run_key != key:
                out.append((run_key, sig.node))
    return out


# ---- the schedulers -------------------------------------------------------------------------

def parse_key(key: str) -> dict[str, str] | None:
    """The scheduler fields of an allocation key (core/membership.allocation_key), each
    checked against its scheduler's name rules (they came from an agent's run-start); None
    when one breaks them: such a name cannot be a job the scheduler runs."""
    try:
        return _fields(key)
    except ConfigError:
        return None


def _fields(key: str) -> dict[str, str]:
    kind, _, rest = key.partition(":")
    if kind == "slurm":
        return {"kind": kind, "job_id": check("job_id", rest, SLURM_JOB_ID_RE)}
    if kind == "kubernetes":
        ns, _, name = rest.partition("/")
        out = {"kind": kind, "namespace": check("namespace", ns, K8S_NAMESPACE_RE)}
        if name.startswith("pod/"):
            out["pod"] = check("pod", name[4:], K8S_NAME_RE)
        else:
            out["uid"] = check("uid", name, K8S_UID_RE)
        return out
    raise ConfigError("allocation", f"unknown allocation key {key!r:.80}")


def _run(argv: Sequence[str], timeout_s: float, ok: tuple[int, ...] = (0,),
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                           check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unanswered(f"{argv[0]}: {e}") from None
    if r.returncode not in ok:
        raise Unanswered(f"{' '.join(argv[:4])} exited {r.returncode}: "
                         f"{(r.stderr or r.stdout).strip()[:300]}")
    return r


def slurm_asker(scontrol: str = "scontrol", timeout_s: float = ASK_TIMEOUT_S,
                env: dict[str, str] | None = None) -> Ask:
    def ask(key: str) -> frozenset[str]:
        fields = parse_key(key)
        if fields is None or fields["kind"] != "slurm":
            return frozenset()
        from faultwatch.actuate.slurm import parse_show

        r = _run([scontrol, "show", "job", fields["job_id"], "-o"], timeout_s, ok=(0, 1),
                 env=env)
        if r.returncode == 1 or "Invalid job id" in (r.stderr or ""):
            return frozenset()  # Slurm does not know it (or purged it): it holds nothing
        info = parse_show(r.stdout)
        if info.get("JobState") not in HOLDING_STATES:
            return frozenset()
        nodelist = info.get("NodeList", "")
        if not nodelist or nodelist in ("(null)", "None"):
            return frozenset()
        out = _run([scontrol, "show", "hostnames", nodelist], timeout_s, env=env).stdout
        return frozenset(h.strip() for h in out.split() if h.strip())
    return ask


def kubernetes_asker(backend: Any) -> Ask:
    """`backend`: an actuate KubernetesBackend (its HTTP client and credentials)."""
    def ask(key: str) -> frozenset[str]:
        fields = parse_key(key)
        if fields is None or fields["kind"] != "kubernetes":
            return frozenset()
        ns = fields["namespace"]
        try:
            if "pod" in fields:
                pod = backend._request("GET", f"/api/v1/namespaces/{ns}/pods/{fields['pod']}",  # noqa: SLF001
                                       ok404=True)
                return _pods_nodes([pod] if pod else [])
            for label in UID_LABELS:
                q = urllib.parse.urlencode({"labelSelector": f"{label}={fields['uid']}"})
                listing = backend._request("GET", f"/api/v1/namespaces/{ns}/pods?{q}") or {}  # noqa: SLF001
                if listing.get("items"):
                    return _pods_nodes(listing["items"])
            return frozenset()
        except FaultwatchError as e:
            raise Unanswered(str(e)) from None
    return ask


def _pods_nodes(pods: Iterable[dict[str, Any]]) -> frozenset[str]:
    out: set[str] = set()
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName")
        if phase in ("Succeeded", "Failed") or not node:
            continue
        out.add(str(node))
        name = (pod.get("metadata") or {}).get("name")
        if name:
            out.add(str(name))  # docs/agent.md names a pod's agent after the pod
    return frozenset(out)


def parse_exec(text: str) -> tuple[str, ...]:
    """--allocation-exec: a JSON list of strings with EXEC_FIELDS placeholders."""
    import orjson

    try:
        argv = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ConfigError("--allocation-exec", f"not a JSON list of strings: {e}") from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError("--allocation-exec", "must be a non-empty JSON list of strings")
    for a in argv:
        for name in _PLACEHOLDER.findall(a):
            if name not in EXEC_FIELDS:
                raise ConfigError("--allocation-exec", f"unknown placeholder {{{name}}}; "
                                                       f"known: {', '.join(EXEC_FIELDS)}")
    if _PLACEHOLDER.search(argv[0]):
        raise ConfigError("--allocation-exec", "the program cannot be a placeholder")
    return tuple(argv)


def exec_asker(template: tuple[str, ...], timeout_s: float = ASK_TIMEOUT_S) -> Ask:
    def ask(key: str) -> frozenset[str]:
        fields = parse_key(key)
        if fields is None:
            return frozenset()
        argv = [_PLACEHOLDER.sub(lambda m: fields.get(m.group(1), ""), a) for a in template]
        r = _run(argv, timeout_s, ok=(0, 1))
        if r.returncode == 1:
            return frozenset()
        return frozenset(n for n in re.split(r"[\s,]+", r.stdout) if n)
    return ask


def from_args(args: Any) -> Allocations | None:
    """The allocation check `faultwatch process` was asked for, or None."""
    kind = getattr(args, "allocation_check", None)
    if not kind:
        return None
    timeout = float(getattr(args, "allocation_timeout_s", ASK_TIMEOUT_S))
    if kind == "slurm":
        return Allocations(slurm_asker(args.scontrol, timeout), kind, timeout)
    if kind == "kubernetes":
        from faultwatch.actuate import plugins

        # the actuator's kubernetes plug-in: $KUBECONFIG, ~/.kube/config, else in-cluster
        backend = plugins.build("kubernetes", {**vars(args), "k8s_pod_selector": None})
        return Allocations(kubernetes_asker(backend), kind, timeout)
    if not getattr(args, "allocation_exec", None):
        raise ConfigError("--allocation-exec", "--allocation-check exec needs the command")
    return Allocations(exec_asker(parse_exec(args.allocation_exec), timeout), kind, timeout)
