"""Kafka security settings (SSL, SASL) for every client, from flags, environment and a file;
faultwatch.kafka.clients applies them to every client it builds."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from faultwatch import settings
from faultwatch.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV_PREFIX = settings.PREFIX + "KAFKA_"
CONFIG_ENV = settings.KAFKA_CONFIG.name

# The settings a flag, variable or config-file key can give: name -> what it is (each one's
# variable FAULTWATCH_KAFKA_<KEY> is declared in faultwatch/settings.py).
KEYS: dict[str, str] = {key: var.doc for key, var in settings.KAFKA.items()}


@dataclass(frozen=True)
class KafkaSecurity:
    """How a client authenticates to Kafka and protects the connection; validated on creation."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise ConfigError("security_protocol", f"{self.security_protocol!r} is not one of "
                                                   f"{', '.join(PROTOCOLS)}")
        if self.sasl:
            if self.sasl_mechanism is None:
                object.__setattr__(self, "sasl_mechanism", "PLAIN")
            if self.sasl_mechanism not in MECHANISMS:
                raise ConfigError("sasl_mechanism", f"{self.sasl_mechanism!r} is not one of "
                                                    f"{', '.join(MECHANISMS)}")
            if not self.username:
                raise ConfigError("username", f"{self.security_protocol} needs a SASL user name")
            if not self.password:
                raise ConfigError("password", f"{self.security_protocol} needs a SASL password "
                                              f"({ENV_PREFIX}PASSWORD or a password file)")
        elif self.sasl_mechanism or self.username or self.password:
            raise ConfigError("security_protocol", "a SASL mechanism, user or password was "
                              f"given but the protocol is {self.security_protocol}; use "
                              "SASL_PLAINTEXT or SASL_SSL")
        if not self.tls and (self.ca_file or self.cert_file or self.key_file):
            raise ConfigError("security_protocol", "certificate files were given but the "
                              f"protocol is {self.security_protocol}; use SSL or SASL_SSL")
        if self.key_file and not self.cert_file:
            raise ConfigError("key_file", "a client key needs a client certificate (cert_file)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(name, f"{path} is not a readable file")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for SSL/SASL_SSL (system CAs unless ca_file), else None."""
        if not self.tls:
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            ctx = create_ssl_context(cafile=self.ca_file, certfile=self.cert_file,
                                     keyfile=self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("ca_file" if self.ca_file else "cert_file",
                              f"could not load the TLS files: {e}") from e
        if self.ca_file is None:
            ctx.load_default_certs()
        ctx.check_hostname = self.check_hostname
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaProducer/Consumer/AdminClient (beside bootstrap)."""
        kw: dict[str, Any] = {"security_protocol": self.security_protocol}
        ctx = self.ssl_context()
        if ctx is not None:
            kw["ssl_context"] = ctx
        if self.sasl:
            kw.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                      sasl_plain_password=self.password)
        return kw

    def faust_settings(self) -> dict[str, Any]:
        """Settings for faust.App: `broker_credentials` (empty for PLAINTEXT)."""
        import faust

        ctx = self.ssl_context()
        if self.sasl:
            creds: Any = faust.SASLCredentials(username=self.username, password=self.password,
                                               ssl_context=ctx, mechanism=self.sasl_mechanism)
            return {"broker_credentials": creds}
        if ctx is not None:
            return {"broker_credentials": faust.SSLCredentials(ctx)}
        return {}

    def describe(self) -> str:
        """One line for logs, without secrets."""
        who = f" user={self.username} mechanism={self.sasl_mechanism}" if self.sasl else ""
        return f"protocol={self.security_protocol}{who}"


_bool = settings.parse_bool  # the one boolean grammar


def _read_secret(key: str, path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or e}") from e
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(key, f"{path} is empty")
    return secret


def load_config_file(path: Path) -> dict[str, Any]:
    """The `kafka:` section (or the whole mapping) of a YAML file; paths made absolute."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(where, f"invalid YAML: {getattr(e, 'problem', e)}") from e
    if data is None:
        return {}
    if isinstance(data, dict) and isinstance(data.get("kafka"), dict):
        data = data["kafka"]
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a mapping of Kafka settings")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(str(path), f"unknown key(s) {', '.join(map(str, unknown))}; known: "
                                     f"{', '.join(KEYS)}")
    out = dict(data)
    for key in ("password_file", "ca_file", "cert_file", "key_file"):
        if out.get(key) is not None:
            p = Path(str(out[key])).expanduser()
            out[key] = str(p if p.is_absolute() else path.parent / p)
    return out


def from_sources(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                 config_file: Path | None = None) -> KafkaSecurity:
    """Settings from flags over FAULTWATCH_KAFKA_* variables over the config file.

    The config file is `config_file`, else $FAULTWATCH_KAFKA_CONFIG, else none. A password
    comes from `password`, else `password_file` (at the highest level giving either)."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise ConfigError(unknown[0], "not a Kafka security setting")
    path = config_file or settings.KAFKA_CONFIG.get(env)
    from_env = {k: settings.KAFKA[k].raw(env) for k in KEYS}
    layers = [load_config_file(path) if path is not None else {},
              {k: v for k, v in from_env.items() if v is not None}, given]
    merged: dict[str, Any] = {}
    for layer in layers:
        if "password" in layer or "password_file" in layer:  # a higher level replaces both
            merged.pop("password", None)
            merged.pop("password_file", None)
        merged.update(layer)
    password = merged.pop("password", None)
    password_file = merged.pop("password_file", None)
    if password is None and password_file is not None:
        password = _read_secret("password_file", Path(str(password_file)))
    kw: dict[str, Any] = {"password": None if password is None else str(password)}
    for key in ("security_protocol", "sasl_mechanism"):
        if merged.get(key) is not None:
            kw[key] = str(merged[key]).strip().upper().replace("_", "-") \
                if key == "sasl_mechanism" else str(merged[key]).strip().upper()
    if merged.get("username") is not None:
        kw["username"] = str(merged["username"])
    for key in ("ca_file", "cert_file", "key_file"):
        if merged.get(key) is not None:
            kw[key] = Path(str(merged[key])).expanduser()
    if merged.get("check_hostname") is not None:
        kw["check_hostname"] = _bool("check_hostname", merged["check_hostname"])
    return KafkaSecurity(**kw)


_current: KafkaSecurity | None = None


def configure(settings: KafkaSecurity) -> None:
    """Make `settings` the process-wide Kafka security (the CLI calls this after parsing)."""
    global _current
    _current = settings


def current() -> KafkaSecurity:
    """The configured settings, else those of the environment (and its config file)."""
    global _current
    if _current is None:
        _current = from_sources()
    return _current


def client_kwargs() -> dict[str, Any]:
    """current().client_kwargs(): what faultwatch.kafka.clients adds to every client."""
    return current().client_kwargs()
