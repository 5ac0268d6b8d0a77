"""Rule sets distributed through Kafka, kept as one import for the CLI's `rules push`
registration: the record (rules_record), the command (rules_push), the watcher (rules_watch)."""

from faultwatch.streams.rules_push import cmd_rules_push, publish_record, push, register
from faultwatch.streams.rules_record import RULESET_KEY, build_record, ruleset_of_record

__all__ = ["RULESET_KEY", "build_record", "cmd_rules_push", "publish_record", "push",
           "register", "ruleset_of_record"]
