"""`faultwatch notify`: send decisions to webhooks (Slack, Feishu, DingTalk, JSON), grouped, and
to Alertmanager as alerts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultwatch import settings
from faultwatch.cli import options
from faultwatch.errors import ConfigError
from faultwatch.notify.alerts import AlertPolicy
from faultwatch.notify.grouping import GROUP_FIELDS, GroupingPolicy
from faultwatch.notify.limit import RateLimits, RetryPolicy
from faultwatch.wire.topics import NOTIFY_GROUP

if TYPE_CHECKING:  # the sender (urllib, email) is imported when notify runs, not per command
    from faultwatch.notify.service import NotifierConfig

SECRET_ENV = settings.WEBHOOK_SECRET.name
WEBHOOKS_ENV = settings.WEBHOOKS.name
ALERTMANAGERS_ENV = settings.ALERTMANAGERS.name


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The notify-specific flags."""
    p.add_argument("--webhook", action="append", default=[], metavar="[FORMAT=]URL",
                   help="where to post; FORMAT is json (default), slack, feishu or dingtalk; "
                        "repeat for several receivers. Visible in `ps`: a URL that holds "
                        "a token (Slack services/..., Feishu hook/..., access_token=...) is "
                        f"refused here; give it in --webhook-file or ${WEBHOOKS_ENV}")
    p.add_argument("--webhook-file", type=Path, action="append", default=[],
                   help="a file of webhooks, one [FORMAT=]URL per line (# comments); "
                        f"also read: ${WEBHOOKS_ENV} (whitespace-separated)")
    p.add_argument("--max-posts-per-min", type=float,
                   default=options.default_of(RateLimits, "per_webhook_per_min"),
                   help="posts per minute to one webhook; beyond it decisions go into a "
                        "digest (default %(default)g)")
    p.add_argument("--max-posts-per-min-total", type=float,
                   default=options.default_of(RateLimits, "total_per_min"),
                   help="posts per minute to all webhooks together (default %(default)g)")
    p.add_argument("--digest-interval-s", type=float,
                   default=options.default_of(RateLimits, "digest_interval_s"),
                   help="a webhook's digest of held-back decisions is sent this long after "
                        "the first one (default %(default)g)")
    p.add_argument("--min-post-gap-s", type=float,
                   default=options.default_of(RateLimits, "min_gap_s"),
                   help="posts to one webhook at least this far apart (Slack: ~1 s; default "
                        "%(default)g)")
    p.add_argument("--webhook-secret-file", type=Path, default=None,
                   help=f"signing secret of Feishu/DingTalk bots (default ${SECRET_ENV})")
    p.add_argument("--group-by", default=",".join(options.default_of(GroupingPolicy,
                                                                      "group_by")),
                   help=f"labels that form a group, from {', '.join(GROUP_FIELDS)} "
                        "(default %(default)s)")
    p.add_argument("--group-wait-s", type=float,
                   default=options.default_of(GroupingPolicy, "group_wait_s"),
                   help="wait this long after a group's first decision before sending "
                        "(default %(default)g)")
    p.add_argument("--group-interval-s", type=float,
                   default=options.default_of(GroupingPolicy, "group_interval_s"),
                   help="send a group's new decisions at most this often (default "
                        "%(default)g)")
    p.add_argument("--repeat-interval-s", type=float,
                   default=options.default_of(GroupingPolicy, "repeat_interval_s"),
                   help="resend a group whose decisions still fire after this long (default "
                        "%(default)g)")
    p.add_argument("--resolve-timeout-s", type=float,
                   default=options.default_of(GroupingPolicy, "resolve_timeout_s"),
                   help="a decision fires this long after it arrived (default %(default)g)")
    p.add_argument("--retries", type=int, default=options.default_of(RetryPolicy, "attempts"),
                   help="tries per message (default %(default)s)")
    p.add_argument("--retry-base-s", type=float,
                   default=options.default_of(RetryPolicy, "base_s"),
                   help="first retry delay, doubled each time up to "
                        f"{options.default_of(RetryPolicy, 'max_s'):g} s (default %(default)g)")
    p.add_argument("--group-id", default=NOTIFY_GROUP,
                   help="consumer group (one notifier group sends each decision once; default "
                        f"{NOTIFY_GROUP})")
    p.add_argument("--from-beginning", action="store_true",
                   help="a new consumer group starts at the oldest decision, not the newest")
    options.add_max_decision_age(p)
    g = p.add_argument_group(
        "Alertmanager (its v2 API; every alert to every URL, as Prometheus sends to each "
        "member of an HA cluster; its routes, silences and inhibitions then apply)")
    g.add_argument("--alertmanager", action="append", default=[], metavar="URL",
                   help="an Alertmanager, e.g. http://alertmanager:9093; repeat for an HA "
                        "cluster. A URL with a password or token is refused here (`ps` shows "
                        f"it): give it in --alertmanager-file or ${ALERTMANAGERS_ENV}")
    g.add_argument("--alertmanager-file", type=Path, action="append", default=[],
                   help="a file of Alertmanager URLs, one per line (# comments); also read: "
                        f"${ALERTMANAGERS_ENV} (whitespace-separated)")
    g.add_argument("--alertmanager-ca-file", type=Path, help="CA bundle of its TLS certificate")
    g.add_argument("--alertmanager-cert-file", type=Path, help="client certificate (mTLS)")
    g.add_argument("--alertmanager-key-file", type=Path, help="the client certificate's key")
    g.add_argument("--alertmanager-basic-auth-file", type=Path,
                   help="basic auth, one line `user:password`")
    g.add_argument("--alertmanager-bearer-token-file", type=Path,
                   help="bearer token (read again for every post)")
    g.add_argument("--alertmanager-resend-s", type=float,
                   default=options.default_of(AlertPolicy, "resend_s"),
                   help="open alerts are posted again this often, each valid for 4 times "
                        "this (default %(default)g)")
    g.add_argument("--alertmanager-max-open-s", type=float,
                   default=options.default_of(AlertPolicy, "max_open_s"),
                   help="an alert whose job never shows healthy again resolves after this "
                        "(default %(default)g); a notify decision's after --resolve-timeout-s")
    p.add_argument("--replay-state", type=Path, default=None,
                   help="file of the decision ids already taken, so a restarted notifier "
                        "still refuses a replay (default ~/.faultwatch/notify-<group>.seen)")


def config_of(args: argparse.Namespace, bootstrap: str, topic: str,
              status_topic: str | None = None) -> NotifierConfig:
    from faultwatch.notify.alertmanager import Alertmanager
    from faultwatch.notify.http import HttpSecurity
    from faultwatch.notify.sender import Receiver
    from faultwatch.notify.service import NotifierConfig

    secret = None
    if args.webhook_secret_file is not None:
        try:
            secret = args.webhook_secret_file.read_text().strip()
        except OSError as e:
            raise ConfigError(str(args.webhook_secret_file), f"cannot read: {e.strerror}") from e
    else:
        secret = settings.WEBHOOK_SECRET.get()
    try:
        policy = GroupingPolicy(
            group_by=tuple(g.strip() for g in args.group_by.split(",") if g.strip()),
            group_wait_s=args.group_wait_s, group_interval_s=args.group_interval_s,
            repeat_interval_s=args.repeat_interval_s, resolve_timeout_s=args.resolve_timeout_s)
        retry = RetryPolicy(attempts=max(1, args.retries), base_s=args.retry_base_s)
        limits = RateLimits(per_webhook_per_min=args.max_posts_per_min,
                            total_per_min=args.max_posts_per_min_total,
                            digest_interval_s=args.digest_interval_s,
                            min_gap_s=args.min_post_gap_s)
    except ValueError as e:
        raise ConfigError("notify", str(e)) from e
    receivers = tuple(Receiver.parse(spec, secret) for spec in webhook_specs(args))
    alertmanagers = tuple(Alertmanager(url) for url in alertmanager_urls(args))
    if not receivers and not alertmanagers:
        raise ConfigError("--webhook", f"no receiver: give --webhook, --webhook-file, "
                                       f"${WEBHOOKS_ENV}, or --alertmanager")
    try:
        alert_policy = AlertPolicy(resend_s=args.alertmanager_resend_s,
                                   notice_open_s=args.resolve_timeout_s,
                                   max_open_s=args.alertmanager_max_open_s)
    except ValueError as e:
        raise ConfigError("notify", str(e)) from e
    security = HttpSecurity(ca_file=args.alertmanager_ca_file,
                            cert_file=args.alertmanager_cert_file,
                            key_file=args.alertmanager_key_file,
                            basic_auth_file=args.alertmanager_basic_auth_file,
                            bearer_token_file=args.alertmanager_bearer_token_file)
    from faultwatch.trust.replay import max_age_s

    state = args.replay_state or Path.home() / ".faultwatch" / f"notify-{args.group_id}.seen"
    state.parent.mkdir(parents=True, exist_ok=True)
    return NotifierConfig(bootstrap=bootstrap, topic=topic, receivers=receivers,
                          group_id=args.group_id, policy=policy, retry=retry,
                          from_beginning=args.from_beginning,
                          max_decision_age_s=max_age_s(args.max_decision_age_s),
                          replay_state=state, limits=limits, alertmanagers=alertmanagers,
                          alert_policy=alert_policy, alertmanager_security=security,
                          status_topic=status_topic, holds_topic=options.topics(args).holds)


def webhook_specs(args: argparse.Namespace) -> list[str]:
    """Webhooks from flags, files and the environment, in that order. A flag's URL that
    holds a token is refused (ConfigError, exit 2): every user on the host sees it in `ps`."""
    return _specs("--webhook", args.webhook, "--webhook-file", args.webhook_file, WEBHOOKS_ENV)


def alertmanager_urls(args: argparse.Namespace) -> list[str]:
    """Alertmanagers from flags, files and the environment, by the webhooks' rules."""
    return _specs("--alertmanager", args.alertmanager, "--alertmanager-file",
                  args.alertmanager_file, ALERTMANAGERS_ENV)


def _specs(flag: str, given: list[str], file_flag: str, files: list[Path],
           env: str) -> list[str]:
    from faultwatch.notify.sender import Receiver, holds_token

    for spec in given:
        secret = holds_token(spec)
        if secret is not None:
            raise ConfigError(flag, f"{Receiver.parse(spec).where}...: {secret} is a "
                              "credential, and a flag is visible to every user in `ps`; give "
                              f"this URL in {file_flag} FILE or ${env}")
    specs = list(given)
    for path in files:
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(str(path), f"cannot read: {e.strerror}") from e
        specs += [ln.strip() for ln in text.splitlines()
                  if ln.strip() and not ln.strip().startswith("#")]
    specs += (settings.var(env).get() or "").split()
    return specs


def run(cfg: NotifierConfig) -> int:
    """Run the notifier until SIGTERM/SIGINT."""
    from faultwatch.eventlog import log_event, set_component
    from faultwatch.notify.service import Notifier
    from faultwatch.trust.decisions import decision_verifier
    from faultwatch.trust.records import DecisionGate

    set_component("notify")
    gate = DecisionGate(decision_verifier(), log_event)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await Notifier(cfg, gate, log_event).run(stop)

    asyncio.run(main())
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    from faultwatch.eventlog import set_component

    set_component("notify")
    topics = options.topics(args)
    cfg = config_of(args, options.need_bootstrap(args), topics.decisions, topics.status)
    options.serve_service_metrics(args, "notify")
    return run(cfg)


def register(sub: Any) -> None:
    p = sub.add_parser("notify", help="send decisions to webhooks (Slack, Feishu, DingTalk, "
                       "JSON), grouped like Alertmanager, or to Alertmanager as alerts",
                       description="Consume decisions and post grouped notifications, or "
                       "alerts to Alertmanager; see docs/operating.md.")
    options.add_kafka(p)
    add_arguments(p)
    options.add_metrics(p)
    options.add_logging(p)
    p.set_defaults(func=cmd_notify)
