"""Judging boot-check notes: failed checks, and the odd node of a job (versions, bandwidth)."""

from __future__ import annotations

from typing import Any

from faultwatch.agents.bootcheck import check, not_applicable
from faultwatch.registry.checks import compare_nodes, failed_checks


def node(torch: str, busbw: float, driver: str = "535.104.05") -> list[dict[str, Any]]:
    return [check("torch", True, torch), check("driver", True, driver),
            check("gpus", True, {"count": 8, "types": ["NVIDIA H100 80GB HBM3"]}),
            not_applicable("nccl", "CPU"),
            check("allreduce", True, {"ok": True, "busbw_gb_s": busbw})]


def test_compare_nodes_names_the_odd_version_and_the_slow_node() -> None:
    same = {f"n{i}": node("2.3.0", 180.0) for i in range(4)}
    assert compare_nodes(same) == []
    odd = {**same, "n2": node("2.4.0", 178.0), "n3": node("2.3.0", 40.0, "550.54.15")}
    found = {(f["check"], f["node"]) for f in compare_nodes(odd)}
    assert found == {("torch", "n2"), ("driver", "n3"), ("allreduce", "n3")}
    t = next(f for f in compare_nodes(odd) if f["check"] == "torch")
    assert t["expected"] == "2.3.0" and t["value"] == "2.4.0" and t["basis"] == "majority"
    assert compare_nodes({"only": node("2.3.0", 1.0)}) == []


def test_two_nodes_that_differ_name_the_one_unlike_the_reference() -> None:
    pair = {"a": node("2.3.0", 1.0), "b": node("2.4.0", 1.0)}
    # no majority and no reference: both named
    assert {f["node"] for f in compare_nodes(pair) if f["check"] == "torch"} == {"a", "b"}
    # the rank-0 node is the reference: the other one is odd
    named = [f for f in compare_nodes(pair, reference="b") if f["check"] == "torch"]
    assert [(f["node"], f["value"], f["expected"]) for f in named] == [("a", "2.3.0", "2.4.0")]
    assert "reference" in named[0]["basis"]


def test_failed_checks_are_only_checks_that_ran_and_failed() -> None:
    data = {"ok": False, "checks": [check("disk:/x", False, None, "OSError: read-only"),
                                    not_applicable("gpus", "CPU"), check("torch", True, "2"),
                                    {"name": 3, "status": "fail"}, "junk"]}
    assert [c["name"] for c in failed_checks(data)] == ["disk:/x"]
    assert failed_checks({"checks": "nope"}) == [] and failed_checks({}) == []


def test_render_checks_says_when_and_what_failed() -> None:
    from faultwatch.registry.checks import render_checks

    line = render_checks({"when": "restart", "checks": [
        check("disk:/x", False, None, "NotADirectoryError: /x"), check("torch", True, "2.5.1"),
        not_applicable("gpus", "CPU")]})
    assert line == ("bootcheck (restart): FAILED: disk:/x FAILED (NotADirectoryError: /x), "
                    "torch ok 2.5.1, gpus n/a")
    assert render_checks({"checks": [check("torch", True, "2")]}).startswith(
        "bootcheck (start): ok")


def test_a_node_without_torch_is_odd_among_nodes_with_it() -> None:
    with_torch = [check("torch", True, "2.5.1")]
    without = [not_applicable("torch", "ModuleNotFoundError: No module named 'torch'")]
    found = compare_nodes({"a": with_torch, "b": with_torch, "c": without})
    assert [(f["node"], f["value"]) for f in found] == [("c", "not installed")]
