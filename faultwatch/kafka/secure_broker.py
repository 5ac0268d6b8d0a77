"""`faultwatch kafka up --secure`: the local broker locked down, one principal per role.

Listeners (all on 127.0.0.1), none of which takes an unauthenticated client:
- CLIENTS, SASL_SSL with SCRAM-SHA-512: every faultwatch client (the bootstrap printed);
- INTERNAL, SASL_PLAINTEXT with PLAIN: inter-broker traffic, the broker principal only;
- CONTROLLER, SASL_PLAINTEXT with PLAIN: KRaft, the broker principal only (KRaft keeps SCRAM
  credentials in its own metadata log, so the controller listener cannot use SCRAM).
The StandardAuthorizer denies what no ACL allows; the broker principal is the only super
user. Role principals `faultwatch-<role>` get SCRAM passwords of their own, stored when the
storage is formatted (from a 0600 argument file, never the command line), and the role
ACLs of faultwatch.kafka.acls.

Data directory layout (beside broker.py's): `secure/` (0700: CA and broker keys, the
broker principal's password), `clients/<role>.yaml` (`--kafka-config` files),
`clients/<role>.password` (0600), `clients/ca.pem`.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from faultwatch.errors import BrokerError
from faultwatch.kafka import acl_admin, acls
from faultwatch.kafka import broker as kafka_local
from faultwatch.kafka import settings as kafka_settings
from faultwatch.kafka.settings import KafkaSecurity

BROKER_USER = "faultwatch-broker"
MECHANISM = "SCRAM-SHA-512"
SECURE_DIR = "secure"
CLIENTS_DIR = "clients"
_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule required"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def user_of(role: str) -> str:
    """The SCRAM user name of a role (its principal is `User:<name>`)."""
    return acls.DEFAULT_PRINCIPALS[role].split(":", 1)[1]


@dataclass(frozen=True)
class SecureBroker:
    """A running locked-down broker: its SASL_SSL bootstrap and one client file per role."""

    bootstrap: str
    data_dir: Path
    clients: dict[str, Path]
    ca_file: Path

    def security(self, role: str) -> KafkaSecurity:
        """The settings of `role`'s client file (as `--kafka-config` would load them)."""
        return kafka_settings.from_sources(env={}, config_file=self.clients[role])


def _secret() -> str:
    return secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe inside JAAS and SCRAM quoting


def _read_or_make(path: Path) -> str:
    if path.is_file():
        text = path.read_text().strip()
        if text:
            return text
    value = _secret()
    kafka_local.write_private(path, value + "\n")
    return value


def _ensure_tls(d: Path) -> tuple[Path, Path, str]:
    """A CA and a broker certificate for 127.0.0.1/localhost (made once); the PKCS#12
    keystore is rewritten with a fresh password each start. -> (ca.pem, broker.p12, pw)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_pem, ca_key_pem, key_pem, cert_pem = (d / "ca.pem", d / "ca.key", d / "broker.key",
                                             d / "broker.pem")
    pem = serialization.Encoding.PEM
    if not all(p.is_file() for p in (ca_pem, ca_key_pem, key_pem, cert_pem)):
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                "faultwatch local broker CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=3650))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                           False, False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                            kafka_local.HOST)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=825))
                .add_extension(x509.SubjectAlternativeName([
                    x509.IPAddress(ipaddress.ip_address(kafka_local.HOST)),
                    x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        plain = serialization.NoEncryption()
        pkcs8 = serialization.PrivateFormat.PKCS8
        kafka_local.write_private(ca_key_pem, ca_key.private_bytes(pem, pkcs8, plain).decode())
        kafka_local.write_private(key_pem, key.private_bytes(pem, pkcs8, plain).decode())
        cert_pem.write_bytes(cert.public_bytes(pem))
        ca_pem.write_bytes(ca.public_bytes(pem))
    broker_key = serialization.load_pem_private_key(key_pem.read_bytes(), None)
    if not isinstance(broker_key, ec.EllipticCurvePrivateKey):
        raise BrokerError(f"{key_pem} is not the EC key faultwatch made; remove {d}")
    password = _secret()
    p12 = pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, x509.load_pem_x509_certificate(cert_pem.read_bytes()),
        [x509.load_pem_x509_certificate(ca_pem.read_bytes())],
        serialization.BestAvailableEncryption(password.encode()))
    kafka_local.write_private(d / "broker.p12", "")
    (d / "broker.p12").write_bytes(p12)
    return ca_pem, d / "broker.p12", password


class LockedDown:
    """kafka_local.Listeners for the secure broker (see the module docstring)."""

    def __init__(self, data: Path, internal_port: int | None = None) -> None:
        self.data = data
        self.secure = data / SECURE_DIR
        self.secure.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.secure.chmod(0o700)
        self.clients_dir = data / CLIENTS_DIR
        self.broker_password = _read_or_make(self.secure / "broker.password")
        self.passwords = {role: _read_or_make(self.clients_dir / f"{role}.password")
                          for role in acls.ROLES}
        self._internal_port = internal_port

    def _internal(self) -> int:
        if self._internal_port is None:  # keep the previous one across restarts if free
            for listener in kafka_local._props(self.data).get("listeners", "").split(","):  # noqa: SLF001
                if listener.startswith("INTERNAL://"):
                    previous = int(listener.rsplit(":", 1)[1])
                    if kafka_local._port_free(previous):  # noqa: SLF001
                        self._internal_port = previous
            if self._internal_port is None:
                self._internal_port = kafka_local.free_port()
        return self._internal_port

    def properties(self, host: str, port: int, cport: int) -> str:
        iport = self._internal()
        if iport in (port, cport):
            raise BrokerError(f"the internal listener port {iport} collides with {port}/{cport}")
        ca, keystore, kpw = _ensure_tls(self.secure)
        self.write_clients(ca)
        u, pw = BROKER_USER, self.broker_password
        plain = f'{_PLAIN} username="{u}" password="{pw}" user_{u}="{pw}";'
        return "\n".join([
            f"controller.quorum.voters=1@{host}:{cport}",
            f"listeners=CLIENTS://{host}:{port},INTERNAL://{host}:{iport},"
            f"CONTROLLER://{host}:{cport}",
            f"advertised.listeners=CLIENTS://{host}:{port},INTERNAL://{host}:{iport}",
            "listener.security.protocol.map=CLIENTS:SASL_SSL,INTERNAL:SASL_PLAINTEXT,"
            "CONTROLLER:SASL_PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=INTERNAL",
            "sasl.mechanism.controller.protocol=PLAIN",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={plain}",
            "listener.name.internal.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.internal.plain.sasl.jaas.config={plain}",
            f"listener.name.clients.sasl.enabled.mechanisms={MECHANISM}",
            f"listener.name.clients.{MECHANISM.lower()}.sasl.jaas.config={_SCRAM}",
            f"listener.name.clients.ssl.keystore.location={keystore}",
            "listener.name.clients.ssl.keystore.type=PKCS12",
            f"listener.name.clients.ssl.keystore.password={kpw}",
            f"listener.name.clients.ssl.key.password={kpw}",
            "listener.name.clients.ssl.client.auth=none",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{BROKER_USER}",
            "allow.everyone.if.no.acl.found=false",
            # topics are made on purpose (here, by the admin role, by Faust for its own): an
            # auto-created topic has the broker's partition count, not the one a table needs
            "auto.create.topics.enable=false",
            "",
        ])

    def format_args(self) -> list[str]:
        return [arg for role, pw in sorted(self.passwords.items())
                for arg in ("--add-scram", f'{MECHANISM}=[name="{user_of(role)}",'
                                           f'password="{pw}"]')]

    def probe(self) -> tuple[str, KafkaSecurity]:
        return self.internal_bootstrap(), self.broker_security()

    def internal_bootstrap(self) -> str:
        for listener in kafka_local._props(self.data).get("listeners", "").split(","):  # noqa: SLF001
            if listener.startswith("INTERNAL://"):
                return listener.split("://", 1)[1]
        raise BrokerError(f"{self.data / kafka_local.PROPS_FILE} names no INTERNAL listener")

    def broker_security(self) -> KafkaSecurity:
        return KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             username=BROKER_USER, password=self.broker_password)

    def write_clients(self, ca: Path) -> dict[str, Path]:
        """`clients/<role>.yaml` (+ `<role>.password`, `ca.pem`) for every role."""
        d = self.clients_dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "ca.pem").write_bytes(ca.read_bytes())
        out: dict[str, Path] = {}
        for role in acls.ROLES:
            out[role] = d / f"{role}.yaml"
            out[role].write_text(
                f"# faultwatch kafka up --secure: the {role} role's Kafka settings "
                f"(--kafka-config)\nkafka:\n  security_protocol: SASL_SSL\n"
                f"  sasl_mechanism: {MECHANISM}\n  username: {user_of(role)}\n"
                f"  password_file: {role}.password\n  ca_file: ca.pem\n")
        return out


def clients_of(data: Path) -> dict[str, Path]:
    return {role: data / CLIENTS_DIR / f"{role}.yaml" for role in acls.ROLES}


async def _provision(plan: LockedDown, scope: acls.Scope, partitions: int) -> None:
    from faultwatch.kafka.admin import ensure_all
    from faultwatch.wire.topics import Topics

    bootstrap, sec = plan.internal_bootstrap(), plan.broker_security()
    await ensure_all(bootstrap, Topics(scope.prefix), partitions, security=sec)
    await acl_admin.apply(bootstrap, sec, scope, acls.table(scope))


def up(port: int = 9093, data_dir: Path | None = None, controller_port: int | None = None,
       scope: acls.Scope | None = None,
       partitions: int | None = None) -> SecureBroker:
    """Start (or find) the locked-down broker of `data_dir`, create the faultwatch topics of
    `scope` and apply its role ACLs (both idempotent); return its address and client files."""
    from faultwatch.wire.topics import DEFAULT_PARTITIONS

    data = kafka_local._resolve(data_dir, port)  # noqa: SLF001
    if (data / "logs" / "meta.properties").exists() and not (data / SECURE_DIR).is_dir():
        raise BrokerError(f"{data} holds a broker formatted without --secure; start it the "
                          "same way (or use a new data directory)")
    plan = LockedDown(data)
    bootstrap = kafka_local.up(port, data, controller_port, listeners=plan)
    asyncio.run(_provision(plan, scope or acls.Scope(), partitions or DEFAULT_PARTITIONS))
    return SecureBroker(bootstrap, data, clients_of(data), data / CLIENTS_DIR / "ca.pem")
