"""Kafka security settings: precedence of flags, environment and file; validation; client kwargs."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from faultwatch.errors import ConfigError
from faultwatch.kafka import settings as kafka_settings
from faultwatch.kafka.settings import KafkaSecurity, from_sources


def test_plaintext_by_default() -> None:
    sec = from_sources(env={})
    assert sec == KafkaSecurity()
    assert sec.client_kwargs() == {"security_protocol": "PLAINTEXT"}


def test_flags_override_environment_override_file(tmp_path: Path) -> None:
    cfg = tmp_path / "k.yaml"
    cfg.write_text("security_protocol: SASL_PLAINTEXT\nusername: file-user\n"
                   "password: file-pw\nsasl_mechanism: scram_sha_256\n")
    env = {"FAULTWATCH_KAFKA_CONFIG": str(cfg), "FAULTWATCH_KAFKA_USERNAME": "env-user"}
    sec = from_sources(env=env)
    assert (sec.username, sec.password, sec.sasl_mechanism) == ("env-user", "file-pw",
                                                                "SCRAM-SHA-256")
    sec = from_sources({"username": "flag-user"}, env=env)
    assert sec.username == "flag-user"
    kw = sec.client_kwargs()
    assert kw == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                  "sasl_plain_username": "flag-user", "sasl_plain_password": "file-pw"}


def test_a_password_file_at_a_higher_level_replaces_a_lower_password(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file\n")
    cfg = tmp_path / "k.yaml"
    cfg.write_text("kafka:\n  security_protocol: SASL_SSL\n  username: u\n  password: old\n")
    sec = from_sources(env={"FAULTWATCH_KAFKA_CONFIG": str(cfg),
                            "FAULTWATCH_KAFKA_PASSWORD_FILE": str(tmp_path / "pw")})
    assert sec.password == "from-file" and sec.sasl_mechanism == "PLAIN"
    assert "from-file" not in repr(sec)
    assert isinstance(sec.client_kwargs()["ssl_context"], ssl.SSLContext)


def test_relative_paths_in_the_file_are_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("pw")
    cfg = tmp_path / "k.yaml"
    cfg.write_text("security_protocol: SASL_PLAINTEXT\nusername: u\npassword_file: secret\n")
    assert from_sources(config_file=cfg, env={}).password == "pw"


@pytest.mark.parametrize("env,key", [
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "TLS"}, "security_protocol"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAULTWATCH_KAFKA_USERNAME": "u"},
     "password"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAULTWATCH_KAFKA_PASSWORD": "p"},
     "username"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAULTWATCH_KAFKA_USERNAME": "u",
      "FAULTWATCH_KAFKA_PASSWORD": "p", "FAULTWATCH_KAFKA_SASL_MECHANISM": "GSSAPI"},
     "sasl_mechanism"),
    ({"FAULTWATCH_KAFKA_USERNAME": "u", "FAULTWATCH_KAFKA_PASSWORD": "p"}, "security_protocol"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "FAULTWATCH_KAFKA_CA_FILE": "/no/such.pem"},
     "ca_file"),
    ({"FAULTWATCH_KAFKA_CA_FILE": "/etc/hostname"}, "security_protocol"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "FAULTWATCH_KAFKA_CHECK_HOSTNAME": "maybe"},
     "check_hostname"),
    ({"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FAULTWATCH_KAFKA_USERNAME": "u",
      "FAULTWATCH_KAFKA_PASSWORD_FILE": "/no/such/pw"}, "password_file"),
])
def test_invalid_settings_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_sources(env=env)
    assert info.value.key == key


def test_config_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "k.yaml"
    cfg.write_text("security_protocol: SSL\npasword: x\n")
    with pytest.raises(ConfigError, match=r"k\.yaml: unknown key\(s\) pasword"):
        from_sources(config_file=cfg, env={})
    cfg.write_text("security_protocol: SSL\n  bad: [\n")
    with pytest.raises(ConfigError, match=r"k\.yaml:2"):
        from_sources(config_file=cfg, env={})


def test_check_hostname_false_reaches_the_ssl_context() -> None:
    sec = from_sources(env={"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SSL",
                            "FAULTWATCH_KAFKA_CHECK_HOSTNAME": "false"})
    ctx = sec.client_kwargs()["ssl_context"]
    assert ctx.check_hostname is False and ctx.verify_mode == ssl.CERT_REQUIRED


def test_flags_parse_into_settings(tmp_path: Path) -> None:
    from faultwatch.cli import options

    parser = argparse.ArgumentParser()
    options.add_kafka(parser)
    args = parser.parse_args(["--kafka-security-protocol", "SASL_PLAINTEXT",
                              "--kafka-username", "u", "--kafka-sasl-mechanism", "SCRAM-SHA-512"])
    sec = options.kafka_security(args, env={"FAULTWATCH_KAFKA_PASSWORD": "p"})
    assert (sec.security_protocol, sec.username, sec.password, sec.sasl_mechanism) == (
        "SASL_PLAINTEXT", "u", "p", "SCRAM-SHA-512")
    # the password itself is never a flag: it would show in `ps`
    assert "--kafka-password" not in parser._option_string_actions  # noqa: SLF001
    assert "--kafka-password-file" in parser._option_string_actions  # noqa: SLF001


def test_faust_credentials_match_the_client_kwargs() -> None:
    faust = pytest.importorskip("faust")
    sec = KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                        username="u", password="p")
    creds = sec.faust_settings()["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username, creds.password) == (
        "SASL_SSL", "SCRAM-SHA-256", "u", "p")
    assert KafkaSecurity().faust_settings() == {}
    ssl_only = KafkaSecurity(security_protocol="SSL").faust_settings()["broker_credentials"]
    assert ssl_only.protocol.value == "SSL"


KAFKA_CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}


def hand_built_clients(root: Path, files: list[Path]) -> list[str]:
    """Every place outside faultwatch/kafka/ that names an aiokafka client class (an import,
    an attribute or a call: naming it is how a module builds one behind the factory's back),
    and every faust.App built without clients.faust_settings()."""
    import ast

    found: list[str] = []
    for path in files:
        rel = path.relative_to(root)
        if rel.parts[0] == "kafka":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "faust.App" and not \
                    any(k.arg is None and "faust_settings" in ast.unparse(k.value)
                        for k in node.keywords):
                found.append(f"{rel}:{node.lineno}: faust.App without the security settings")
            found += [f"{rel}:{node.lineno}: {n}" for n in names if n in KAFKA_CLIENTS]
    return sorted(set(found))


def test_no_module_outside_kafka_builds_its_own_kafka_client() -> None:
    """A client built by hand would skip the security settings (plaintext to a secured
    cluster): every producer, consumer and admin client comes from faultwatch.kafka.clients."""
    import faultwatch

    root = Path(faultwatch.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert root / "kafka" / "clients.py" in files and len(files) > 100  # walked the package
    assert hand_built_clients(root, files) == []


def test_the_client_guard_finds_a_hand_built_client(tmp_path: Path) -> None:
    """Positive control: a planted module with each way of building a client is named."""
    pkg = tmp_path / "faultwatch"
    (pkg / "kafka").mkdir(parents=True)
    (pkg / "kafka" / "clients.py").write_text("from aiokafka import AIOKafkaProducer\n")
    bad = pkg / "streams" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import aiokafka\nimport faust\n"
                   "def f():\n"
                   "    from aiokafka.admin import AIOKafkaAdminClient\n"
                   "    c = aiokafka.AIOKafkaConsumer('t')\n"
                   "    return faust.App('x', broker='kafka://h')\n")
    files = sorted(pkg.rglob("*.py"))
    assert hand_built_clients(pkg, files) == [
        "streams/bad.py:4: AIOKafkaAdminClient", "streams/bad.py:5: AIOKafkaConsumer",
        "streams/bad.py:6: faust.App without the security settings"]


def test_the_factory_applies_the_security_settings(tmp_path: Path) -> None:
    """Every client the factory builds carries the configured protocol and SASL user; an
    explicit `security` (the local broker's probe) wins over the process's settings."""
    import asyncio

    from faultwatch.kafka import clients

    sec = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                        username="u", password="p" * 8)

    async def build() -> list[tuple[str, str | None]]:
        kafka_settings.configure(sec)
        try:
            made = [clients.producer(bootstrap_servers="h:1", acks="all"),
                    clients.consumer("t", bootstrap_servers="h:1", group_id=None),
                    clients.admin(bootstrap_servers="h:1"),
                    clients.producer(bootstrap_servers="h:1", security=KafkaSecurity())]
        finally:
            kafka_settings.configure(from_sources(env={}))
        seen = []
        for c in made:
            kc = c.client if hasattr(c, "client") else c._client  # the producer's is public
            seen.append((kc._security_protocol, kc._sasl_plain_username))
            await (c.close() if hasattr(c, "close") else c.stop())
        return seen

    assert asyncio.run(build()) == [("SASL_PLAINTEXT", "u")] * 3 + [("PLAINTEXT", None)]
