"""Kafka security settings: precedence of flags, environment and file; validation; client kwargs."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from faultwatch.errors import ConfigError
from faultwatch.kafka_settings import KafkaSecurity, from_sources


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


def test_every_kafka_client_in_the_package_takes_the_security_settings() -> None:
    """A new AIOKafka client built without kafka_settings would talk plaintext to a secured
    cluster; this walks the package and names any such construction."""
    import ast

    import faultwatch

    root = Path(faultwatch.__file__).parent
    clients = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
    exempt = {("kafka_local.py", "_probe")}  # the local broker's own readiness probe
    missing: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call):
                    continue
                name = getattr(call.func, "id", getattr(call.func, "attr", ""))
                faust_app = ast.unparse(call.func) == "faust.App"
                if name not in clients and not faust_app \
                        and not (name.endswith("factory") and call.keywords):
                    continue
                needed = "faust_settings" if faust_app else "client_kwargs"
                secured = any(k.arg is None and needed in ast.unparse(k.value)
                              for k in call.keywords)
                if not secured and (path.name, fn.name) not in exempt:
                    missing.append(f"{path.relative_to(root)}:{call.lineno} in {fn.name}")
    assert not missing, "Kafka clients without the kafka_settings kwargs: " + \
        ", ".join(missing)
