"""The options every `faultwatch` command shares, defined once: the parser class (no
abbreviations, usage errors exit 2 with a hint), the Kafka options (bootstrap, topic prefix,
the --kafka-* security flags) of every command that talks to Kafka, the output format, the
event-line options of the long-running commands (--log-format, -q, -v), and the rule-file and
policy flags of `run` and `process`. docs/cli.md lists them."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from faultwatch import settings
from faultwatch.core import policy
from faultwatch.core.names import did_you_mean
from faultwatch.errors import EXIT_USAGE, ConfigError
from faultwatch.kafka import settings as kafka_settings
from faultwatch.wire.topics import DEFAULT_PREFIX, Topics

if TYPE_CHECKING:
    from faultwatch.actuate.backend import Option

BOOTSTRAP_ENV = settings.BOOTSTRAP.name
PREFIX_ENV = settings.TOPIC_PREFIX.name


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (`--topic X` is an error, never `--topic-prefix X`),
    with a hint appended to usage errors (e.g. where the wrapped command goes) and a
    did-you-mean for a misspelt subcommand, choice or option (`faultwatch stauts`,
    `--jbo`: what Python 3.14's suggest_on_error does, on every version). Subparsers made
    from it are of this class too."""

    hint = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        given = kwargs.get("formatter_class")  # a command's own raw text stays raw in ours
        if not (isinstance(given, type) and issubclass(given, HelpFormatter)):
            kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        """The help with the shared Kafka options' group after the command's own groups."""
        groups = self._action_groups
        self._action_groups = [g for g in groups if g.title != KAFKA_GROUP] + \
            [g for g in groups if g.title == KAFKA_GROUP]
        try:
            return super().format_help()
        finally:
            self._action_groups = groups

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        hint = f"\n  hint: {self.hint}" if self.hint else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            hint = did_you_mean(value, action.choices) if isinstance(value, str) and \
                action.choices is not None else ""
            if not hint:
                raise
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}") from e

    def unrecognized(self, args: list[str], hint: str = "") -> NoReturn:
        """The usage error for arguments no option of this (sub)command takes, naming the
        options close to each misspelt one."""
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        close = "".join(did_you_mean(a.split("=", 1)[0], known, n=2) for a in args
                        if a.startswith("--"))
        self.error(f"unrecognized arguments: {' '.join(args)}{close}{hint}")


def chosen(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command `ns` was parsed for: `faultwatch rules show ...` ->
    the `show` parser of `rules`."""
    p = parser
    while True:
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(ns, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return p
        p = sub.choices[name]


KAFKA_GROUP = "Kafka options (the same on every command that talks to Kafka: docs/cli.md)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option's default shown where it has one
    (not for flags, nor where the help already says it); the shared Kafka options folded
    into `[--bootstrap HOST:PORT] [Kafka options]` after the command's own options in the
    usage line (their group comes last in the help, Parser.format_help)."""

    def add_usage(self, usage: str | None, actions: Any, groups: Any,
                  prefix: str | None = None) -> None:
        acts = list(actions)
        kafka = [a for a in acts if getattr(a, "kafka_option", False)]
        if usage is None and kafka:
            own = [a for a in acts if a not in kafka]
            shown = [a for a in kafka if "--bootstrap" in a.option_strings]
            folded = argparse.Action(["Kafka options"], dest=argparse.SUPPRESS, nargs=0)
            acts = [*(a for a in own if a.option_strings), *shown, folded,
                    *(a for a in own if not a.option_strings)]
        super().add_usage(usage, acts, groups, prefix)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if ("default" in text or d is None or d is argparse.SUPPRESS or isinstance(d, bool)
                or d == [] or not action.option_strings or action.nargs == 0):
            return text
        return f"{text} (default %(default)s)"


def default_of(cls: type, name: str) -> Any:
    """The default of field `name` of the library's dataclass `cls`: a flag's default is
    read from the code that uses it, never spelled a second time."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise KeyError(f"{cls.__name__} has no defaulted field {name!r}")


def subcommands(p: argparse.ArgumentParser, dest: str, **kwargs: Any) -> Any:
    """p's subparsers, of the Parser class."""
    return p.add_subparsers(dest=dest, parser_class=Parser, **kwargs)


# ---- Kafka: bootstrap, topic prefix, security ---------------------------------------------

def add_kafka(p: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """--bootstrap, --topic-prefix and the --kafka-* security flags (never the password: it
    would show in `ps`). On a subcommand (`sub`) they default to SUPPRESS, so the values given
    before the subcommand (`nodes --bootstrap X release N`) are kept."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if sub else value

    g = p.add_argument_group(KAFKA_GROUP, f"security flags override {settings.PREFIX}KAFKA_* "
                             "variables, which override --kafka-config")
    acts = [g.add_argument("--bootstrap", metavar="HOST:PORT",
                           default=default(settings.BOOTSTRAP.get()),
                           help=f"Kafka bootstrap servers (default ${BOOTSTRAP_ENV})"),
            add_topic_prefix(g, sub=sub),
            g.add_argument("--kafka-config", type=Path, metavar="FILE", default=default(None),
                           help="YAML file of Kafka settings (default "
                                f"${kafka_settings.CONFIG_ENV})")]
    for key, help_ in kafka_settings.KEYS.items():
        if key == "password":
            continue
        flag = "--kafka-" + key.replace("_", "-")
        choices = ["true", "false"] if key == "check_hostname" else None
        metavar = "FILE" if key.endswith("_file") else None if choices else key.upper()
        acts.append(g.add_argument(flag, dest="kafka_" + key, default=default(None),
                                   choices=choices, metavar=metavar, help=help_))
    for a in acts:
        a.kafka_option = True  # type: ignore[attr-defined]  # folded in usage (HelpFormatter)


def add_topic_prefix(p: Any, *, sub: bool = False) -> argparse.Action:
    """--topic-prefix, defaulting to $FAULTWATCH_TOPIC_PREFIX or the one DEFAULT_PREFIX."""
    value = settings.TOPIC_PREFIX.get() or DEFAULT_PREFIX
    action: argparse.Action = p.add_argument(
        "--topic-prefix", metavar="PREFIX", default=argparse.SUPPRESS if sub else value,
        help=f"topic name prefix (default ${PREFIX_ENV} or '{DEFAULT_PREFIX}')")
    return action


def add_signing_key_file(p: argparse.ArgumentParser, signs: str = "the record",
                         default: Any = None) -> None:
    """--signing-key-file of the commands that write an operator's record (`rules push`,
    `rules rollback`, `nodes quarantine|release`, `jobs hold|mute|...`)."""
    p.add_argument("--signing-key-file", type=Path, default=default,
                   help=f"operator's Ed25519 key that signs {signs} (default "
                        f"${settings.SIGNING_KEY_FILE}; see `faultwatch keys`)")


def add_max_decision_age(p: argparse.ArgumentParser) -> None:
    """--max-decision-age-s of the decisions' consumers (`actuate`, `notify`)."""
    p.add_argument("--max-decision-age-s", type=float, default=None,
                   help=f"refuse decisions older than this (default "
                        f"${settings.MAX_DECISION_AGE_S}, else "
                        f"{settings.MAX_DECISION_AGE_S.fallback:g} s; the replay rule)")


def add_plugin_options(g: Any, opts: Iterable[Option]) -> None:
    """A plug-in's own options (actuate/backend.Option) as flags of group `g`."""
    for o in opts:
        g.add_argument(o.flag, dest=o.dest, default=o.default, metavar=o.metavar,
                       choices=o.choices, help=o.help or None)


def kafka_security(args: argparse.Namespace, env: Mapping[str, str] | None = None
                   ) -> kafka_settings.KafkaSecurity:
    """The security settings of the --kafka-* flags, over the environment and config file."""
    flags = {k: getattr(args, "kafka_" + k, None) for k in kafka_settings.KEYS
             if k != "password"}
    return kafka_settings.from_sources(flags, env, getattr(args, "kafka_config", None))


def talks_to_kafka(args: argparse.Namespace) -> bool:
    """Whether the parsed command has the Kafka options (add_kafka)."""
    return hasattr(args, "bootstrap")


def configure_kafka(args: argparse.Namespace) -> None:
    """Make the command's security settings the process-wide ones (checked: ConfigError)."""
    kafka_settings.configure(kafka_security(args))


def need_bootstrap(args: argparse.Namespace) -> str:
    """The bootstrap of a command that cannot work without Kafka; ConfigError (exit 2) in
    every command when it is missing."""
    if not getattr(args, "bootstrap", None):
        raise ConfigError("bootstrap", "no Kafka bootstrap: pass --bootstrap HOST:PORT or set "
                          f"{BOOTSTRAP_ENV} (`faultwatch kafka up` starts a local broker)")
    return str(args.bootstrap)


def topics(args: argparse.Namespace) -> Topics:
    """The topic names under the command's --topic-prefix."""
    return Topics(args.topic_prefix)


# ---- output format ------------------------------------------------------------------------

def add_json(p: argparse.ArgumentParser, what: str = "one JSON object per line") -> None:
    """--json: machine-readable output instead of text for a person."""
    p.add_argument("--json", action="store_true", help=what)


def add_time_range(p: argparse.ArgumentParser) -> None:
    """--since and --until of the readers (`logs`, `decisions`), parsed by
    readers.select.parse_when once the command knows the time."""
    for flag, edge in (("--since", "at or after"), ("--until", "at or before")):
        p.add_argument(flag, metavar="WHEN",
                       help=f"only what happened {edge} WHEN: 10m, 2h, 1d (ago), an ISO 8601 "
                            "time (local unless it has Z or an offset), or Unix seconds")


# ---- faultwatch's own event lines (run, agent, process, notify, actuate) ------------------

def add_logging(p: argparse.ArgumentParser, default_level: str = "info") -> None:
    """--log-format, -q/--quiet and -v/--verbose: how faultwatch's own event lines are written
    and which are. `default_level` is the command's: `warning` for the commands a person
    watches (run, agent: the decision blocks and the closing summary tell a normal run),
    `info` for services; $FAULTWATCH_LOG_LEVEL overrides it, a flag overrides both."""
    from faultwatch import eventlog

    g = p.add_argument_group("faultwatch's own event lines")
    g.add_argument("--log-format", choices=eventlog.FORMATS,
                   default=settings.LOG_FORMAT.get() or "text",
                   help="text: `ts=... event=... k=v` lines; json: one JSON object per line, "
                        f"same fields plus level (default ${eventlog.FORMAT_ENV} or text)")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="only errors (decisions and the closing summary are still printed)")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: every event line (info), -vv: debug too (default: "
                        f"${eventlog.LEVEL_ENV}, else {default_level})")
    p.set_defaults(log_level_default=default_level)


def log_level(args: argparse.Namespace) -> str:
    """The lowest level of event line written: -q / -v over $FAULTWATCH_LOG_LEVEL over the
    command's default."""
    from faultwatch import eventlog

    if getattr(args, "quiet", False):
        return "error"
    verbose = getattr(args, "verbose", 0) or 0
    if verbose:
        return "debug" if verbose > 1 else "info"
    env = (settings.LOG_LEVEL.get() or "").lower()
    if env:
        if env not in eventlog.LEVEL_NAMES:
            raise ConfigError(eventlog.LEVEL_ENV, f"must be one of "
                              f"{', '.join(eventlog.LEVEL_NAMES)}: {env!r}")
        return env
    return str(getattr(args, "log_level_default", "info"))


def configure_logging(args: argparse.Namespace) -> None:
    """Make the command's event-line settings the process's (add_logging)."""
    from faultwatch import eventlog

    if hasattr(args, "log_format"):
        if args.log_format not in eventlog.FORMATS:  # a bad $FAULTWATCH_LOG_FORMAT default
            raise ConfigError(eventlog.FORMAT_ENV, f"must be one of "
                              f"{', '.join(eventlog.FORMATS)}: {args.log_format!r}")
        eventlog.configure(args.log_format, log_level(args))


# ---- rule files and policy (run, process) -------------------------------------------------

# the policy flags and --no-X switches, declared with their keys (core/policy.py)
POLICY_FLAGS: tuple[tuple[str, type, str], ...] = policy.FLAGS
POLICY_SWITCHES = tuple(key for key, _flag, _help in policy.SWITCHES)


def add_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", action="append", metavar="FILE",
                   help="rule file, added to the built-in rules (repeatable)")


def add_policy(p: argparse.ArgumentParser) -> None:
    """The policy overrides shared by `run` and `process`; each says the policy's default
    (a flag unset leaves the rule files' value, which defaults to it)."""
    defaults = policy.Policy()
    g = p.add_argument_group("policy (overrides the rule files' policy: sections)")
    for name, typ, help_ in POLICY_FLAGS:
        value = getattr(defaults, name)
        text = help_
        if value is not None and "default" not in help_:
            shown = f"default {value:g}" if isinstance(value, float) else f"default {value}"
            text = help_[:-1] + f", {shown})" if help_.endswith(")") else f"{help_} ({shown})"
        metavar = "S" if name.endswith("_s") else "N" if typ is int else \
            "RATE" if typ is float else None
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None,
                       metavar=metavar, help=text)
    for name, flag, help_ in policy.SWITCHES:
        g.add_argument(flag, dest=name, action="store_const", const=False, default=None,
                       help=help_)


def policy_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The policy keys the flags gave (add_policy)."""
    names = [n for n, _, _ in POLICY_FLAGS] + list(POLICY_SWITCHES)
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


# ---- the exit contract (run, agent) -------------------------------------------------------

def add_verdict(p: argparse.ArgumentParser) -> None:
    """The exit contract's flags, the same on `run` and `agent` (docs/cli.md#exit-codes)."""
    from faultwatch.agents.config import EXIT_RESTART, ON_RESTART

    p.add_argument("--verdict-out", metavar="FILE",
                   help="write the verdict as JSON at exit: verdict, exit code, the command's "
                        "own code and signal, the decision, run id, attempt")
    p.add_argument("--on-restart", choices=ON_RESTART, default="relaunch",
                   help="a restart decision: relaunch the command here (default), or exit "
                        f"{EXIT_RESTART} so a scheduler, a shell loop or torchrun relaunches "
                        "this agent with the next attempt")


# ---- the wrapped command and the timeout chain (run, agent, check) -----------------------

def wrapped_command(args: argparse.Namespace) -> tuple[str, ...]:
    """The training command given after `--` (tree.split_command), else a UsageError."""
    from faultwatch.errors import UsageError

    if not args.cmd:
        raise UsageError(f"no command given: put it after --, e.g. "
                         f"`faultwatch {args.command} -- torchrun ...`")
    return tuple(args.cmd)



def add_check(p: argparse.ArgumentParser) -> None:
    """--strict and --no-check: the timeout chain checked once before the launch
    (`faultwatch check`, docs/timeouts.md)."""
    from faultwatch.errors import EXIT_CHAIN

    g = p.add_argument_group("the timeout chain, checked once before the launch "
                             "(docs/timeouts.md)")
    g.add_argument("--strict", action="store_true",
                   help=f"a broken link refuses the launch (exit {EXIT_CHAIN}); without it "
                        "the broken links are printed once and the command runs")
    g.add_argument("--no-check", action="store_true",
                   help="do not check the timeout chain at the start")


# ---- metrics (agent, process, actuate, notify) -------------------------------------------

def add_metrics(p: argparse.ArgumentParser) -> None:
    """--metrics-port and --metrics-address: where Prometheus reads /metrics."""
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on http://ADDRESS:PORT/metrics (0: a free "
                        "port, see --metrics-address-file)")
    p.add_argument("--metrics-address-file", metavar="PATH", default=None,
                   help="write where /metrics listens to PATH as a Prometheus file_sd list "
                        "({job}, {node}, {pid} are filled in; removed at exit)")
    p.add_argument("--metrics-address", default="127.0.0.1",
                   help="address /metrics listens on (default 127.0.0.1; 0.0.0.0 or :: for "
                        "every interface); reads time out after 5 s, at most 16 "
                        "connections at once")


def serve_service_metrics(args: argparse.Namespace, component: str) -> None:
    """/metrics of `actuate` and `notify` (what they refused, their process) on
    --metrics-port when given (0: a free port), and where it listens in
    --metrics-address-file (removed at exit); logs `metrics_listening address=`."""
    from faultwatch import metrics
    from faultwatch.eventlog import log_event

    metrics.check_address_file(args.metrics_address_file, args.metrics_port)
    if args.metrics_port is None:
        return
    server = metrics.serve(args.metrics_port, metrics.service_registry(component),
                           addr=args.metrics_address)
    target, path = metrics.announce(server, args.metrics_address, args.metrics_address_file,
                                    component)
    log_event("metrics_listening", address=target, address_file=path)
