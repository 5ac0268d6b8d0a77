"""`faultwatch completion bash|zsh`: print a shell completion script made from the parser tree.

Static, like `kubectl completion`: the script holds every command path, its subcommands and
options, which options take files and which take one of a few choices, so pressing Tab runs
no Python (a faultwatch start costs seconds on a loaded node) and the node side needs no
completion package (argcomplete would call back into Python on every Tab). zsh runs the same
function through its bash compatibility (bashcompinit)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from faultwatch.cli import helptext

SHELLS = ("bash", "zsh")
_FILE_METAVARS = ("FILE", "PATH", "DIR", "SPOOL_DIR", "STATE_FILE", "DATA_DIR")


def _kind(action: argparse.Action) -> str | None:
    """How an option's value completes: `choices ...`, `file`, `value`; None for a flag."""
    if action.nargs == 0:
        return None
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
        return "choices " + " ".join(str(c) for c in action.choices)
    metavar = str(action.metavar or action.dest).upper()
    if action.type is Path or any(m in metavar for m in _FILE_METAVARS):
        return "file"
    return "value"


def _case(name: str, arms: dict[str, str], default: str = "") -> str:
    body = "".join(f"        {shlex.quote(k)}) echo {shlex.quote(v)} ;;\n"
                   for k, v in arms.items())
    return (f"{name}() {{\n    case \"$1\" in\n{body}        *) echo {shlex.quote(default)} ;;"
            "\n    esac\n}\n")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser`'s tree for `shell` (bash or zsh)."""
    subs: dict[str, str] = {}
    opts: dict[str, str] = {}
    nexts: dict[str, str] = {}
    args: dict[str, str] = {}
    for path, p in helptext.walk(parser):
        key = " ".join(path)
        names: list[str] = []
        flags: list[str] = []
        for a in p._actions:  # noqa: SLF001
            if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                names += list(a.choices)
                continue
            for o in a.option_strings:
                if o.startswith("--"):
                    flags.append(o)
                    kind = _kind(a)
                    if kind is not None:
                        args[f"{key}|{o}"] = kind
        for n in names:
            nexts[f"{key}|{n}"] = f"{key} {n}".strip()
        subs[key] = " ".join(names)
        opts[key] = " ".join(sorted(flags))
    head = "# faultwatch completion: " + (
        "add `source <(faultwatch completion zsh)` to ~/.zshrc\n"
        "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
        if shell == "zsh" else
        "add `source <(faultwatch completion bash)` to ~/.bashrc (or write it to\n"
        "# ~/.local/share/bash-completion/completions/faultwatch)\n")
    return head + "".join([
        _case("_faultwatch_subs", subs), _case("_faultwatch_opts", opts),
        _case("_faultwatch_arg", args, "none"),
        _case("_faultwatch_next_of", nexts, "-"), _MAIN])


_MAIN = r'''_faultwatch() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" path="" i w n kind
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if [[ "$w" == "--" ]]; then  # the wrapped training command (run, agent)
            if ((i == COMP_CWORD - 1)); then
                COMPREPLY=($(compgen -c -- "$cur"))
            else
                COMPREPLY=($(compgen -f -- "$cur"))
            fi
            return 0
        fi
        n="$(_faultwatch_next_of "$path|$w")"
        [[ "$n" != "-" ]] && path="$n"
    done
    kind="$(_faultwatch_arg "$path|$prev")"
    case "$kind" in
        file) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
        value) COMPREPLY=(); return 0 ;;
        choices\ *) COMPREPLY=($(compgen -W "${kind#choices }" -- "$cur")); return 0 ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_faultwatch_opts "$path")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_faultwatch_subs "$path")" -- "$cur"))
        ((${#COMPREPLY[@]})) || COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return 0
}
complete -o filenames -F _faultwatch faultwatch
'''


def cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.root_parser, args.shell), end="")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh)")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def attach(root: argparse.ArgumentParser) -> None:
    """Give `completion` the whole tree it describes (built after it registered)."""
    for path, p in helptext.walk(root):
        if path == ("completion",):
            p.set_defaults(root_parser=root)
