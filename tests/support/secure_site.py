"""A site set up as docs/operating.md says, on a real locked-down broker (`faultwatch kafka up
--secure`): SASL_SSL with one principal and client file per role, the role ACLs, Ed25519 keys
(processor, operator, one per node) and one trust file. Helpers read and write it as a role
would (the readers need the admin role's client file, the processor's group offsets too)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.kafka import broker as kafka_local
from faultwatch.kafka import clients, secure_broker
from faultwatch.kafka.settings import KafkaSecurity
from faultwatch.trust.keys import generate
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

ROLES = ("agent", "processor", "actuator", "admin")


@dataclass
class SecureSite:
    """A running secure broker (`data`), its client files, and the site's keys (`keys`)."""

    bootstrap: str
    data: Path
    keys: Path
    code: dict[str, str]  # PYTHONPATH of another tree whose `kafka` commands to run, or {}

    @classmethod
    def start(cls, d: Path, nodes: Iterable[str], prefix: str = "faultwatch.",
              partitions: int = 2, code: dict[str, str] | None = None) -> SecureSite:
        data = d / "broker"
        port = kafka_local.free_port()
        out = subprocess.run([faultwatch_exe(), "kafka", "up", "--secure", "--data-dir",
                              str(data), "--port", str(port), "--topic-prefix", prefix,
                              "--partitions", str(partitions)],
                             capture_output=True, text=True, timeout=300,
                             env={**job_env(), **(code or {})})
        assert out.returncode == 0, out.stderr[-3000:]
        keys = d / "keys"
        keys.mkdir()
        lines = [generate(keys / "proc.key", "processor", "proc").line(),
                 generate(keys / "ops.key", "operator", "ops").line()]
        lines += [generate(keys / f"{n}.key", "node", n).line() for n in nodes]
        (keys / "trust").write_text("\n".join(lines) + "\n")
        return cls(out.stdout.splitlines()[-1].strip(), data, keys, dict(code or {}))

    def stop(self) -> None:
        kafka_local.down(self.data)

    # ---- files ----------------------------------------------------------------------------

    def client(self, role: str) -> Path:
        return secure_broker.clients_of(self.data)[role]

    def client_files(self, role: str) -> dict[str, bytes]:
        """What `kafka up --secure` wrote for a role: <role>.yaml, <role>.password, ca.pem
        (the Secret deploy/kubernetes makes from them)."""
        d = self.data / "clients"
        return {f"{role}.yaml": (d / f"{role}.yaml").read_bytes(),
                f"{role}.password": (d / f"{role}.password").read_bytes(),
                "ca.pem": (d / "ca.pem").read_bytes()}

    def key(self, name: str) -> Path:
        return self.keys / f"{name}.key"

    @property
    def trust(self) -> Path:
        return self.keys / "trust"

    def security(self, role: str) -> KafkaSecurity:
        return secure_broker.SecureBroker(self.bootstrap, self.data,
                                          secure_broker.clients_of(self.data),
                                          self.data / "clients" / "ca.pem").security(role)

    def env(self, role: str, prefix: str = "faultwatch.", trust: bool = True,
            **extra: str) -> dict[str, str]:
        """A process of `role`: its client file, the bootstrap, the prefix, the trust file."""
        e = {k: v for k, v in job_env().items()
             if not k.startswith(("FAULTWATCH_DECISION_KEY", "FAULTWATCH_KAFKA",
                                  "FAULTWATCH_TRUST", "FAULTWATCH_SIGNING", "FAULTWATCH_NODE"))}
        e.update(FAULTWATCH_BOOTSTRAP=self.bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix,
                 FAULTWATCH_KAFKA_CONFIG=str(self.client(role)))
        if trust:
            e["FAULTWATCH_TRUST_FILE"] = str(self.trust)
        e.update(extra)
        return e

    # ---- as the admin role ------------------------------------------------------------------

    def new_prefix(self, prefix: str, code: bool = False) -> subprocess.CompletedProcess[str]:
        """`faultwatch kafka acls --apply` for a new prefix, as the admin role (with `code`:
        from the tree under test, else from this one)."""
        return subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", prefix,
                               "--apply", "--partitions", "2"],
                              env=self.env("admin", **(self.code if code else {})),
                              capture_output=True, text=True, timeout=120)

    def topics(self) -> set[str]:
        async def main() -> set[str]:
            admin = clients.admin(bootstrap_servers=self.bootstrap,
                                  security=self.security("admin"))
            await admin.start()
            try:
                return set(await admin.list_topics())
            finally:
                await admin.close()

        return asyncio.run(main())

    def decisions(self, prefix: str, job: str) -> list[dict[str, Any]]:
        """The job's decisions now (`faultwatch decisions` as the admin role)."""
        out = subprocess.run([faultwatch_exe(), "decisions", "--job", job, "--json"],
                             env=self.env("admin", prefix), capture_output=True, text=True,
                             timeout=60)
        if out.returncode == 7:
            return []
        assert out.returncode == 0, out.stderr
        got = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
        return [d for d in got if d["reason"]["kind"] != "diagnose"]

    def produce(self, role: str, topic: str, values: list[tuple[bytes, bytes | None]]) -> None:
        """Write (key, value) records as `role` (acks=all)."""
        async def main() -> None:
            p = clients.producer(bootstrap_servers=self.bootstrap, acks="all",
                                 security=self.security(role))
            await p.start()
            try:
                for key, value in values:
                    await p.send_and_wait(topic, value, key=key)
            finally:
                await p.stop()

        asyncio.run(main())

    def records(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) of every record of a one-partition topic now, as the admin role."""
        async def main() -> list[tuple[bytes | None, bytes | None]]:
            from aiokafka import TopicPartition

            c = clients.consumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, security=self.security("admin"))
            await c.start()
            try:
                tp = TopicPartition(topic, 0)
                c.assign([tp])
                await c.seek_to_beginning(tp)
                end = (await c.end_offsets([tp]))[tp]
                out: list[tuple[bytes | None, bytes | None]] = []
                while await c.position(tp) < end:
                    for msgs in (await c.getmany(timeout_ms=1000)).values():
                        out += [(m.key, m.value) for m in msgs]
                return out
            finally:
                await c.stop()

        return asyncio.run(main())

    def wait_processed(self, prefix: str, timeout_s: float = 120.0) -> None:
        """Positive control for "no decision": the processor's group committed every record
        now on the logs topic, then on the signals topic (tests/support/cluster.py)."""
        group = f"{prefix}processor"
        for topic in (f"{prefix}logs", f"{prefix}signals"):
            target = asyncio.run(self._offsets(group, topic))[0]
            assert target, topic

            def done(topic: str = topic, target: dict[Any, int] = target) -> bool:
                got = asyncio.run(self._offsets(group, topic))[1]
                return all(got.get(tp, 0) >= end for tp, end in target.items())

            wait_until(done, timeout_s, f"{group} to commit {topic}", interval_s=0.5)

    async def _offsets(self, group: str, topic: str) -> tuple[dict[Any, int], dict[Any, int]]:
        from aiokafka import TopicPartition

        sec = self.security("admin")
        admin = clients.admin(bootstrap_servers=self.bootstrap, security=sec)
        consumer = clients.consumer(bootstrap_servers=self.bootstrap, security=sec,
                                    enable_auto_commit=False)
        await admin.start()
        await consumer.start()
        try:
            parts = [TopicPartition(topic, p) for p in
                     sorted(consumer.partitions_for_topic(topic) or ())] or \
                [TopicPartition(topic, p["partition"]) for d in
                 await admin.describe_topics([topic]) for p in d.get("partitions", [])]
            ends = await consumer.end_offsets(parts) if parts else {}
            committed = {tp: max(0, m.offset) for tp, m in
                         (await admin.list_consumer_group_offsets(group)).items()
                         if tp.topic == topic}
            return dict(ends), committed
        finally:
            await consumer.stop()
            await admin.close()

    def group_stable(self, group: str) -> bool:
        async def main() -> bool:
            from aiokafka.errors import KafkaError

            admin = clients.admin(bootstrap_servers=self.bootstrap,
                                  security=self.security("admin"))
            await admin.start()
            try:
                got = await admin.describe_consumer_groups([group])
                return bool(got and got[0].groups and str(got[0].groups[0][2]) == "Stable")
            except KafkaError:
                return False
            finally:
                await admin.close()

        return asyncio.run(main())

    # ---- as a node, and a new app id (issue 35) -------------------------------------------

    def produce_signed(self, node: str, topic: str,
                       values: list[tuple[bytes, bytes]], role: str = "agent") -> None:
        """Write (key, value) records signed with `node`'s key (what a process holding that
        key can write), as `role`."""
        from faultwatch.trust.keys import read_signing_key
        from faultwatch.trust.nodesig import NodeSigner

        signer = NodeSigner(read_signing_key(self.key(node)))
        self.produce_raw(role, topic, [(k, v, signer.headers(v)) for k, v in values])

    def produce_raw(self, role: str, topic: str,
                    records: list[tuple[bytes | None, bytes, list[Any]]]) -> None:
        """Write (key, value, headers) records as `role` (acks=all)."""
        async def main() -> None:
            p = clients.producer(bootstrap_servers=self.bootstrap, acks="all",
                                 security=self.security(role))
            await p.start()
            try:
                futs = [await p.send(topic, v, key=k, headers=h) for k, v, h in records]
                await asyncio.gather(*futs)
            finally:
                await p.stop()

        asyncio.run(main())

    def messages(self, topic: str, role: str = "admin") -> list[Any]:
        """Every record of `topic` now, all partitions, with keys and headers, as `role`."""
        async def main() -> list[Any]:
            from aiokafka import TopicPartition

            c = clients.consumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, security=self.security(role))
            await c.start()
            try:
                await c._client.force_metadata_update()  # noqa: SLF001
                tps = [TopicPartition(topic, p)
                       for p in sorted(c.partitions_for_topic(topic) or ())]
                c.assign(tps)
                await c.seek_to_beginning(*tps)
                ends = await c.end_offsets(tps)
                out: list[Any] = []
                while any([await c.position(tp) < ends[tp] for tp in tps]):
                    for msgs in (await c.getmany(timeout_ms=1000)).values():
                        out += msgs
                return out
            finally:
                await c.stop()

        return asyncio.run(main())

    def grant_app(self, prefix: str, app_id: str) -> None:
        """The operator's ACLs for another processor app id (a new consumer group and
        table) on `prefix`: `faultwatch kafka acls --app-id ... --apply`, as the admin role."""
        out = subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", prefix,
                              "--app-id", app_id, "--apply", "--partitions", "2"],
                             env=self.env("admin"), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
