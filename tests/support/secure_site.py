"""A secured site on the locked-down local broker (`faultwatch kafka up --secure`): the broker
with one SCRAM principal and client file per role, the keys of docs/operating.md (processor,
operator, one per node) and one trust file; each process gets its role's environment."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.kafka import broker as kafka_local
from faultwatch.kafka import secure_broker
from faultwatch.kafka.secure_broker import SecureBroker
from faultwatch.trust.keys import generate, read_signing_key
from faultwatch.trust.nodesig import NodeSigner
from tests.support.processes import faultwatch_exe, job_env

NODES = ("GOODNODE", "BADNODE", "CTRLNODE", "NODE4", "NODE5", "NODE6", "NODE7")


class SecureSite:
    """Start with `up()`, end with `down()`; one per test module (the broker takes a while)."""

    def __init__(self, root: Path, prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.keys = root / "keys"
        self.keys.mkdir(parents=True, exist_ok=True)
        lines = [generate(self.keys / "proc.key", "processor").line(),
                 generate(self.keys / "ops.key", "operator").line()]
        lines += [generate(self.keys / f"{n}.key", "node", n).line() for n in NODES]
        self.trust = root / "trust"
        self.trust.write_text("\n".join(lines) + "\n")
        self.data = root / "broker"
        self.broker: SecureBroker | None = None

    def up(self) -> SecureBroker:
        out = subprocess.run([faultwatch_exe(), "kafka", "up", "--secure", "--data-dir",
                              str(self.data), "--port", str(kafka_local.free_port()),
                              "--topic-prefix", self.prefix],
                             capture_output=True, text=True, timeout=300, env=job_env())
        assert out.returncode == 0, out.stderr[-3000:]
        self.broker = SecureBroker(out.stdout.splitlines()[-1].strip(), self.data,
                                   secure_broker.clients_of(self.data),
                                   self.data / "clients" / "ca.pem")
        return self.broker

    def down(self) -> None:
        kafka_local.down(self.data)

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    def key(self, name: str) -> Path:
        return self.keys / f"{name}.key"

    def env(self, role: str, **extra: str) -> dict[str, str]:
        """A process of `role` (agent, processor, actuator, admin): its client file, the
        trust file, and for the processor its signing key."""
        e = {k: v for k, v in job_env().items()
             if not k.startswith(("FAULTWATCH_KAFKA_", "FAULTWATCH_DECISION_KEY"))}
        e.update(FAULTWATCH_KAFKA_CONFIG=str(self.data / "clients" / f"{role}.yaml"),
                 FAULTWATCH_TRUST_FILE=str(self.trust))
        if role == "processor":
            e["FAULTWATCH_SIGNING_KEY_FILE"] = str(self.key("proc"))
        e.update(extra)
        return e

    def client_kwargs(self, role: str) -> dict[str, Any]:
        assert self.broker is not None
        return self.broker.security(role).client_kwargs()

    def agent(self, job: str, node: str, cmd: Sequence[str], *flags: str,
              key: str | None = None) -> list[str]:
        """`faultwatch agent` for `job` on `node`, signing with `key`'s node key (default:
        the node's own), heartbeats every second, shipping and exiting unless flags say."""
        return [faultwatch_exe(), "agent", "--bootstrap", self.bootstrap, "--topic-prefix",
                self.prefix, "--job", job, "--node", node, "--heartbeat-s", "1",
                "--node-key-file", str(self.key(key or node)), "--no-follow-decisions",
                *flags, "--", *cmd]

    def produce_signed(self, node: str, records: Sequence[tuple[bytes, bytes]],
                       role: str = "agent") -> None:
        """Records on the logs topic signed with `node`'s key (what a process holding that
        key can write), with `role`'s principal."""
        signer = NodeSigner(read_signing_key(self.key(node)))
        self.produce(f"{self.prefix}logs", [(k, v, signer.headers(v)) for k, v in records],
                     role)

    def produce(self, topic: str, records: Sequence[tuple[bytes, bytes, list[Any]]],
                role: str = "agent") -> None:
        from aiokafka import AIOKafkaProducer

        async def main() -> None:
            p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all",
                                 **self.client_kwargs(role))
            await p.start()
            try:
                futs = [await p.send(topic, v, key=k, headers=h) for k, v, h in records]
                await asyncio.gather(*futs)
            finally:
                await p.stop()

        asyncio.run(main())

    def read(self, topic: str, role: str = "admin") -> list[Any]:
        """Every record on `topic` now (value, key, headers), read with `role`'s principal."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def main() -> list[Any]:
            c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, **self.client_kwargs(role))
            await c.start()
            try:
                await c._client.force_metadata_update()  # noqa: SLF001
                tps = [TopicPartition(topic, p) for p in sorted(
                    c.partitions_for_topic(topic) or ())]
                c.assign(tps)
                await c.seek_to_beginning(*tps)
                ends = await c.end_offsets(tps)
                out: list[Any] = []
                while any([await c.position(tp) < ends[tp] for tp in tps]):
                    for msgs in (await c.getmany(timeout_ms=2000)).values():
                        out += msgs
                return out
            finally:
                await c.stop()

        return asyncio.run(main())

    def grant_app(self, app_id: str) -> None:
        """The operator's ACLs for another processor app id (a new consumer group and
        table), as `faultwatch kafka acls --app-id ... --apply` gives them."""
        out = subprocess.run([faultwatch_exe(), "kafka", "acls", "--bootstrap", self.bootstrap,
                              "--topic-prefix", self.prefix, "--app-id", app_id, "--apply"],
                             capture_output=True, text=True, timeout=120,
                             env=self.env("admin"))
        assert out.returncode == 0, out.stderr[-3000:]
