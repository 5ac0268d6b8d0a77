"""Actuators are plug-ins that own their options and construction: the CLI names no backend
and reads none of their flags; a backend gets the values of its own options only."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from faultwatch.actuate import plugins
from faultwatch.actuate.exec import ExecBackend
from faultwatch.actuate.slurm import SlurmBackend
from faultwatch.cli.tree import build_parser
from tests.support.source import PACKAGE, string_literals

CLI = (PACKAGE / "cli" / "actuate.py").read_text()


def test_every_plugin_declares_its_name_options_and_construction() -> None:
    ps = plugins.plugins()
    assert list(ps) == ["slurm", "kubernetes", "exec"]
    for name, p in ps.items():
        assert p.NAME == name and p.TITLE and callable(p.build)
        assert len({o.dest for o in p.OPTIONS}) == len(p.OPTIONS)


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["actuate", *argv])


def test_the_cli_offers_each_plugin_and_its_options() -> None:
    action = next(a for a in build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
                  .choices["actuate"]._actions if a.dest == "backend")
    assert tuple(action.choices) == plugins.names()
    args = _parse("--backend", "slurm", "--scontrol", "/x/scontrol", "--k8s-pod-action",
                  "delete")
    for p in plugins.plugins().values():
        for o in p.OPTIONS:
            assert hasattr(args, o.dest), o.flag


def test_a_backend_is_built_from_its_own_options() -> None:
    args = _parse("--backend", "slurm", "--scontrol", "/x/scontrol")
    b = plugins.build("slurm", vars(args))
    assert isinstance(b, SlurmBackend) and b.scontrol == "/x/scontrol"
    e = plugins.build("exec", {"exec_quarantine": '["echo", "{node}"]'})  # others: defaults
    assert isinstance(e, ExecBackend)


def _reads_args(source: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "args"]


def test_no_backend_reads_the_command_line_and_the_cli_names_no_backend() -> None:
    for name in plugins.names():
        path = Path(plugins.plugins()[name].__file__)  # type: ignore[attr-defined]
        assert _reads_args(path.read_text()) == [], path
    assert [v for _, v in string_literals(CLI) if v in plugins.names()] == []


def test_the_scans_find_planted_couplings() -> None:
    assert _reads_args("def from_args(args):\n    return B(args.scontrol)\n") == [2]
    assert [v for _, v in string_literals('if args.backend == "slurm": pass\n')
            if v in plugins.names()] == ["slurm"]


def test_the_processors_kubernetes_check_takes_the_plugins_connection_options(
        tmp_path: Path) -> None:
    """`process --allocation-check kubernetes` builds the actuator's kubernetes plug-in from
    the plug-in's own --kubeconfig/--context (declared once, offered by both commands)."""
    import pytest

    from faultwatch.actuate import kubernetes
    from faultwatch.errors import ConfigError
    from faultwatch.streams import allocations

    missing = tmp_path / "no-such-kubeconfig"
    args = build_parser().parse_args(["process", "--allocation-check", "kubernetes",
                                      "--kubeconfig", str(missing), "--context", "c1"])
    assert (args.kubeconfig, args.context) == (str(missing), "c1")
    assert {o.dest for o in kubernetes.CONNECTION} <= set(vars(args))
    with pytest.raises(ConfigError, match="no-such-kubeconfig"):
        allocations.from_args(args)
