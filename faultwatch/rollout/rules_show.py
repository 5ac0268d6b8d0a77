"""`faultwatch rules show` and `faultwatch rules diff`: which rules run where, and what a
file or a pending push would change. Cluster mode reads the workers' records on the status
topic and the pushed set on the rules topic; local mode (embedded: `faultwatch run --rules`)
builds the set from the files exactly as `run` does (rules/layers.py)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import orjson

from faultwatch.core.names import did_you_mean
from faultwatch.errors import EXIT_ERROR, EXIT_OK, NotFoundError, RuleError
from faultwatch.rollout.rules_record import layer_of_record, read_rule_files
from faultwatch.rollout.rules_status import (
    describe_lines,
    read_pushed,
    read_workers,
    worker_lines,
)
from faultwatch.rules import diff as rdiff
from faultwatch.rules import layers
from faultwatch.wire.topics import Topics


def known_rule(rule_id: str | None, known: set[str]) -> None:
    """A `--rule ID` no layer defines or disables is a NotFoundError (exit 7) naming the
    close ids, never "not overridden"."""
    if rule_id is not None and rule_id not in known:
        raise NotFoundError(f"unknown rule {rule_id!r}{did_you_mean(rule_id, known)}: no "
                            "layer defines or disables it (`faultwatch rules show` lists "
                            "the layers)")


def show_local(files: Sequence[str], *, rule_id: str | None = None, as_json: bool = False,
               out: TextIO = sys.stdout) -> int:
    """The set `faultwatch run --rules FILES` runs (built-in + files), with provenance."""
    rules = layers.load(files)
    known_rule(rule_id, {r.id for r in rules.ruleset.rules} | set(rules.disabled()))
    d = rules.describe()
    if as_json:
        print(orjson.dumps({"t": "local", "rules": d,
                            "why": rules.why(rule_id) if rule_id else None}).decode(),
              file=out)
        return EXIT_OK
    print("local set (embedded mode: faultwatch run" +
          "".join(f" --rules {f}" for f in files) + ")", file=out)
    for line in describe_lines(d, rule_id, rules.why(rule_id) if rule_id else None):
        print(line, file=out)
    return EXIT_OK


def show_cluster(bootstrap: str, topics: Topics, *, rule_id: str | None = None,
                 as_json: bool = False, out: TextIO = sys.stdout) -> int:
    """Per worker (from its record on the status topic): version, layers, sources. A status
    topic that does not exist is a NotFoundError (a wrong --topic-prefix, or no processor
    ever ran under it), never "no workers"."""
    workers = asyncio.run(read_workers(bootstrap, topics.status, must_exist=True))
    now = time.time()
    if rule_id is not None:  # the built-in ids, and what each worker's layers add or disable
        known = {r.id for res in layers.builtin_layer().results for r in res.rules}
        for w in workers.values():
            d = w.get("rules") or {}
            known |= set(d.get("origins") or {}) | set(d.get("disabled") or {})
            known |= {i for la in d.get("layers", []) for i in la.get("ids", [])}
        known_rule(rule_id, known)
    if as_json:
        for w in sorted(workers.values(), key=lambda w: str(w.get("worker"))):
            print(orjson.dumps(w).decode(), file=out)
        return EXIT_OK
    if not workers:
        print(f"no worker records on {topics.status} (no processor runs, or an older one "
              "that does not publish them)", file=out)
    for w in sorted(workers.values(), key=lambda w: str(w.get("worker"))):
        for line in worker_lines(w, now, rule_id):
            print(line, file=out)
    return EXIT_OK


def _pushed_now(bootstrap: str, topics: Topics) -> tuple[layers.RulesInForce, str]:
    """The set a worker without `--rules` files runs now: built-in + the pushed layer. The
    rules topic (a processor creates it at start, `rules push` too) must exist: a missing one
    is a NotFoundError (a wrong --topic-prefix), never "nothing pushed"."""
    value = asyncio.run(read_pushed(bootstrap, topics.rules, must_exist=True))
    if value is None:
        return layers.load(), "built-in rules (nothing pushed)"
    layer, keep_builtin, rec = layer_of_record(value)
    rules, problems = layers.build([*([layers.builtin_layer()] if keep_builtin else []), layer])
    if rules is None:  # the newest record is refused by the workers too
        raise RuleError(problems)
    return rules, (f"pushed set {rec.get('push_id', '-')} by {rec.get('author', '-')} "
                   f"(built-in + pushed)")


def diff_main(files: Sequence[str], *, current: Sequence[str] | None, bootstrap: str | None,
              topics: Topics, as_json: bool = False, exit_code: bool = False,
              out: TextIO = sys.stdout) -> int:
    """What FILES change against what runs: the local set of `current` files (local mode),
    or, as a pending push, the pushed set every worker runs now (cluster mode)."""
    if bootstrap is None:
        old = layers.load(current or ())
        new = layers.load(files)
        against = "built-in + " + (", ".join(current) if current else "no files")
        notes: list[str] = []
    else:
        old, against = _pushed_now(bootstrap, topics)
        texts, problems = read_rule_files(files)
        if problems:
            raise RuleError(problems)
        new = layers.load(pushed=layers.texts_layer(
            "pushed", [(os.path.basename(f), text) for f, text in texts]))
        notes = _worker_notes(bootstrap, topics, new)
    d = rdiff.diff(old, new)
    if as_json:
        print(orjson.dumps({**d, "against": against, "notes": notes}).decode(), file=out)
    else:
        print(f"against: {against}", file=out)
        for line in rdiff.render(d) + notes:
            print(line, file=out)
    return EXIT_ERROR if exit_code and not rdiff.is_empty(d) else EXIT_OK


def _worker_notes(bootstrap: str, topics: Topics, new: layers.RulesInForce) -> list[str]:
    """Per worker, what the pending push meets there: its version, and ids its own `--rules`
    files define that the push defines too (the pushed definition wins: it is higher)."""
    notes = []
    pushed_ids = {r.id for res in (new.layer("pushed") or layers.Layer("pushed", ())).results
                  for r in res.rules}
    for w in (asyncio.run(read_workers(bootstrap, topics.status))).values():
        rules: dict[str, Any] = w.get("rules") or {}
        files: dict[str, Any] = next((la for la in rules.get("layers", [])
                                      if la.get("layer") == "files"), {})
        both = sorted(pushed_ids & set(files.get("ids") or []))
        line = f"worker {w.get('worker')} runs {rules.get('version')}"
        if files.get("files"):
            line += f"; its --rules files ({', '.join(files['files'])}) stay below the push"
        if both:
            line += f"; the push overrides its {', '.join(both)}"
        notes.append(line)
    return notes
