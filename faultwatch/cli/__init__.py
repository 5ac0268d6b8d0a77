"""The `faultwatch` command line: one argparse tree (tree.py) with one error handler and one
exit-code table (docs/cli.md), one module per command group (run, agent, process, read,
status, diagnose, rules, kafka, nodes, actuate, notify) and ONE options module (options.py:
bootstrap, topic prefix, Kafka security, output format, rule files, policy) that every command
uses. Command functions only turn arguments into a call: reading topics and formatting live
in the library (faultwatch.readers, faultwatch.kafka.reading, ...)."""

from faultwatch.cli.tree import build_parser, main, parse_args, split_command

__all__ = ["build_parser", "main", "parse_args", "split_command"]
