"""What `--help` says about each command beyond its options: a description and examples, one
table for the whole tree (a unit test fails for a command without them, and parses every
example with the real parser, so an example cannot outlive a flag)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# command path -> (description, examples). A command module's own description wins; the
# examples are appended to its epilog.
HELP: dict[str, tuple[str, tuple[str, ...]]] = {
    "": ("Watch distributed training jobs' logs; decide restarts, blacklists, fails. "
         "Embedded mode (`run`) needs nothing else; cluster mode runs `agent` on the nodes "
         "and `process` workers, with Kafka between them. Docs: docs/README.md.",
         ("faultwatch run -- torchrun --nproc-per-node 8 train.py",
          "faultwatch status",
          "faultwatch completion bash > ~/.local/share/bash-completion/completions/faultwatch")),
    "run": ("Embedded mode: run CMD under faultwatch in this process, no Kafka. The same "
            "rules, windows and decisions as a cluster; restarts CMD on a restart decision "
            "and exits with the verdict, never with CMD's own code (docs/cli.md#exit-codes).",
            ("faultwatch run -- torchrun --nproc-per-node 8 train.py",
             "faultwatch run --hang-window-s 60 --max-restarts 1 -- python train.py",
             "faultwatch run --rules site.yaml --verdict-out verdict.json -- python train.py")),
    "agent": ("", ("faultwatch agent --job llama-70b --node $HOSTNAME -- torchrun --nnodes 4 "
                   "--rdzv-id $SLURM_JOB_ID train.py",
                   "faultwatch agent --job llama-70b --on-restart exit -- python train.py")),
    "agent tail": ("", ("faultwatch agent tail --job llama-70b --node n1 /var/log/train.log",)),
    "agent bootcheck": ("", ("faultwatch agent bootcheck --job llama-70b --bootcheck-path "
                             "/data",)),
    "process": ("Cluster mode: a processor worker. It reads the agents' lines, applies the "
                "rules and silence windows, and publishes decisions. Start several with the "
                "same --app-id to share the partitions.",
                ("faultwatch process --bootstrap kafka:9092",
                 "faultwatch process --rules site.yaml --metrics-port 9464")),
    "notify": ("", ("faultwatch notify --webhook-file /etc/faultwatch/webhooks",)),
    "status": ("The jobs the processors know, one row per job: run, attempt, phase, nodes "
               "alive, quietest ranks, window, last decision. On a terminal the table fits "
               "its width; in a pipe or a file every cell is whole, one row per line.",
               ("faultwatch status", "faultwatch status llama-70b --json",
                "faultwatch status --wide | grep llama", "faultwatch status -w")),
    "decisions": ("The decisions published on the decisions topic, each once, oldest first, "
                  "with when they were made (time, age): what faultwatch decided and why.",
                  ("faultwatch decisions --job llama-70b",
                   "faultwatch decisions --action fail --since 1h",
                   "faultwatch decisions -f --json")),
    "logs": ("A job's shipped lines from every node and rank in time order, with a line "
             "where each attempt starts, its decisions and its nodes' exits.",
             ("faultwatch logs llama-70b --rank 3 --since 10m",
              "faultwatch logs llama-70b -f --grep 'NCCL|CUDA'")),
    "diagnose": ("Ask a running job's agents for every rank's Python stack and Flight "
                 "Recorder dump, then print who waits where (cluster mode; embedded mode "
                 "does this before every hang decision).",
                 ("faultwatch diagnose llama-70b", "faultwatch diagnose llama-70b --json")),
    "report": ("A job's incidents and goodput: where its wall time went (productive, "
               "start-up, checkpoint, eval, hang silence, detection, restart, lost work, "
               "waiting), each failure's timeline and lost work, lemon nodes; --fleet: ETTR, "
               "MTTF by cause, time to recover, incidents per 1,000 node-hours.",
               ("faultwatch report llama-70b", "faultwatch report llama-70b --html report.html",
                "faultwatch report --fleet --since 7d",
                "faultwatch report --from incidents.jsonl")),
    "rules": ("Rule files: check, test, try, push, show and diff them (docs/rules.md).",
              ("faultwatch rules check site.yaml", "faultwatch rules show --rule cuda-oom")),
    "rules check": ("Validate rule files: every problem at once as path:line: message, with "
                    "did-you-mean for unknown keys. Exit 0 when valid, 3 with problems.",
                    ("faultwatch rules check site.yaml more.yaml",)),
    "rules test": ("Run the inline `tests:` of every rule (the built-in ones too, unless "
                   "--no-builtin). Exit 0 when all pass, 3 otherwise.",
                   ("faultwatch rules test", "faultwatch rules test site.yaml --no-builtin")),
    "rules classify": ("What faultwatch would decide about a failure ending with this log "
                       "(and exit code), as one JSON object: category, rule, the action the "
                       "job stage takes under the policy, why, and the exit code `run` and "
                       "`agent` then end with.",
                       ("faultwatch rules classify --exit-code 1 crash.log",
                        "faultwatch rules classify --rules site.yaml --explain crash.log")),
    "rules push": ("Validate rule files and publish them to every processor, which reload "
                   "them without a restart. The push adds a layer over each worker's own "
                   "files; sign it with an operator key where processors have a trust file.",
                   ("faultwatch rules push site.yaml --signing-key-file operator.key",)),
    "rules show": ("The rules in force: per processor worker its version and layers "
                   "(built-in, --rules files, the push, flags), or the local set with "
                   "--rules/--local; --rule ID says why that rule is what it is.",
                   ("faultwatch rules show", "faultwatch rules show --local --rule cuda-oom")),
    "rules diff": ("What rule files would change against what runs: the pushed set (a "
                   "pending push) or, with --rules/--local, the local files.",
                   ("faultwatch rules diff site.yaml",
                    "faultwatch rules diff new.yaml --rules site.yaml --exit-code")),
    "check": ("", ("faultwatch check -- torchrun --nnodes 8 --rdzv-backend c10d "
                   "--rdzv-endpoint h0:29400 train.py",
                   "faultwatch check --strict --bootstrap kafka:9092 --job llm -- python "
                   "train.py")),
    "describe": ("", ("faultwatch describe llama-7b", "faultwatch describe llama-7b --json")),
    "rules history": ("", ("faultwatch rules history", "faultwatch rules history --json")),
    "rules rollback": ("", ("faultwatch rules rollback --signing-key-file operator.key",
                            "faultwatch rules rollback --to-revision 3")),
    "jobs": ("", ("faultwatch jobs", "faultwatch jobs --all --json")),
    "jobs hold": ("Hold a job: its restart, blacklist and fail decisions are published as "
                  "notices and not acted on, until the hold expires or is released.",
                  ("faultwatch jobs hold llama-7b --for 2h --reason 'debugging rank 3'",)),
    "jobs mute": ("Mute a job: its decisions are acted on, but `notify` posts nothing about "
                  "it, until the mute expires or is lifted.",
                  ("faultwatch jobs mute llama-7b --for 30m --reason 'known flaky storage'",)),
    "jobs release": ("Release a job's hold now: its decisions are acted on again.",
                     ("faultwatch jobs release llama-7b",)),
    "jobs unmute": ("Lift a job's mute now: `notify` posts about it again.",
                    ("faultwatch jobs unmute llama-7b",)),
    "kafka": ("", ("faultwatch kafka up --port 9092", "faultwatch kafka status --port 9092")),
    "kafka up": ("Start a single-node Kafka broker (KRaft) from Maven Central jars, without "
                 "Docker; print its bootstrap address last. --secure locks it down (SASL_SSL, "
                 "ACLs, one principal per role).",
                 ("faultwatch kafka up --port 9092",
                  "faultwatch kafka up --secure --data-dir /srv/kafka --port 9093")),
    "kafka down": ("Stop the local broker of a data directory (or of --port's default "
                   "directory).", ("faultwatch kafka down --port 9092",)),
    "kafka status": ("Whether a local broker runs: the one faultwatch started in the data "
                     "directory, or any Kafka broker answering on 127.0.0.1:--port. Exit 0 "
                     "when one runs, 1 when none does.",
                     ("faultwatch kafka status --port 9092 --json",)),
    "kafka acls": ("Print the per-role ACLs of a topic prefix; --apply creates them (and the "
                   "topics) on any Kafka, idempotently, and reports grants beyond the table.",
                   ("faultwatch kafka acls --topic-prefix prod. | head",
                    "faultwatch kafka acls --topic-prefix prod. --apply --bootstrap "
                    "kafka:9093 --kafka-config admin.yaml")),
    "kafka fetch": ("Resolve and cache the broker's jars from Maven Central (once), e.g. "
                    "while building an image.", ("faultwatch kafka fetch",)),
    "nodes": ("", ("faultwatch nodes", "faultwatch nodes --json")),
    "nodes quarantine": ("Quarantine a node for a while: actuators drain it and move its "
                         "jobs; it is released when the time is up.",
                         ("faultwatch nodes quarantine gpu-17 --for 2h --reason 'ECC errors'",)),
    "nodes release": ("Release a quarantined node now (actuators resume it). A node the "
                      "registry never saw is refused (exit 7) unless --force.",
                      ("faultwatch nodes release gpu-17 --reason 'GPU replaced'",)),
    "actuate": ("", ("faultwatch actuate --backend slurm --state-file "
                     "/var/lib/faultwatch/actuate.jsonl",)),
    "keys": ("", ("faultwatch keys generate --role operator --name alice",)),
    "keys generate": ("Write a new Ed25519 private key (mode 0600, never overwritten) and "
                      "its public trust-file line beside it (FILE.pub); print its id.",
                      ("faultwatch keys generate --role processor",
                       "faultwatch keys generate --node gpu-17 --out gpu-17.key")),
    "keys show": ("The key id, fingerprint and trust line of a private key file (never the "
                  "key), or every key of a trust file.", ("faultwatch keys show operator.key",)),
    "completion": ("Print a shell completion script for faultwatch's commands, subcommands, "
                   "options and their choices (`source <(faultwatch completion bash)` in "
                   "~/.bashrc). It is static: completing runs no Python.",
                   ("faultwatch completion bash > "
                    "~/.local/share/bash-completion/completions/faultwatch",
                    "faultwatch completion zsh > ~/.faultwatch.zsh  # then: source it in "
                    "~/.zshrc")),
}


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the tree, the top first."""
    yield path, parser
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def apply(parser: argparse.ArgumentParser) -> None:
    """Give every command of the tree its description and examples from HELP."""
    for path, p in walk(parser):
        description, examples = HELP.get(" ".join(path), ("", ()))
        if not p.description and description:
            p.description = description
        if examples:
            head = "more examples:" if "example" in (p.epilog or "") else "examples:"
            block = head + "\n" + "\n".join(f"  {e}" for e in examples)
            p.epilog = f"{p.epilog.rstrip()}\n\n{block}" if p.epilog else block
