"""Defaults by exception class and by errno: table, precedence, extension in rule files."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.rules import check_files, classify, load_ruleset
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()


def tb(*final: str, frames: tuple[str, ...] = ('  File "train.py", line 9, in <module>',
                                               "    main()")) -> str:
    return "\n".join(["Traceback (most recent call last):", *frames, *final])


@pytest.mark.parametrize(("final", "category", "rule"), [
    ("urllib3.exceptions.ProtocolError: ('Connection aborted.', RemoteDisconnected())",
     "retryable", "exception.ProtocolError"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousStateError", "retryable",
     "exception.RendezvousStateError"),
    ("ray.exceptions.ObjectLostError: Failed to retrieve object 00ff. The object was lost.",
     "retryable", "exception.ObjectLostError"),
    ("ray.exceptions.RayTaskError(NodeDiedError): ray::train()", "retryable",
     "exception.NodeDiedError"),
    ("aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected", "retryable",
     "exception.ServerDisconnectedError"),
    ("UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 0", "fatal",
     "exception.UnicodeDecodeError"),
    ("json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)", "fatal",
     "exception.JSONDecodeError"),
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:", "fatal",
     "exception.BackendCompilerFailed"),
    ("MemoryError", "fatal", "exception.MemoryError"),
])
def test_final_exception_maps_by_class(final: str, category: str, rule: str) -> None:
    res = classify(RS, tb(final))
    assert (res["category"], res["rule"], res["line"]) == (category, rule, final)


def test_unknown_class_stays_unknown() -> None:
    assert classify(RS, tb("RuntimeError: something odd"))["category"] == "unknown"
    assert classify(RS, tb("mylib.WeirdThing: x"))["category"] == "unknown"


def test_specific_rule_in_block_beats_class_default() -> None:
    # a chained traceback: the specific cause (CUDA OOM) is on an earlier exception line;
    # the final one's class alone would say retryable
    log = tb("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "",
             "The above exception was the direct cause of the following exception:", "",
             "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "urllib3.exceptions.ProtocolError: lost the worker")
    res = classify(RS, log)
    assert res["category"] == "fatal" and not str(res["rule"]).startswith("exception.")


@pytest.mark.parametrize(("line", "category", "rule"), [
    ("RuntimeError: Connection reset by peer", "retryable", "errno.econnreset"),
    ("OSError: [Errno 113] No route to host", "retryable", None),
    ("OSError: [Errno 112] Host is down", "retryable", "errno.ehostdown"),
    ("RuntimeError: The server socket has failed to listen on any local network address. "
     "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
     "retryable", None),
    ("OSError: [Errno 19] No such device", "hardware", "errno.enodev"),
    ("PermissionError: [Errno 13] Permission denied: '/ckpt'", "fatal", None),
])
def test_errno_by_number_name_and_text(line: str, category: str, rule: str | None) -> None:
    res = classify(RS, line)
    assert res["category"] == category, res
    if rule:
        assert res["rule"] == rule


def test_rule_file_extends_and_overrides_the_table(tmp_path: Path) -> None:
    p = tmp_path / "mine.yaml"
    p.write_text("version: 1\nexceptions:\n  mylib.FlakyThing: retryable\n"
                 "  JSONDecodeError: retryable\n")
    rs = load_ruleset([p])
    assert classify(rs, tb("mylib.FlakyThing: x"))["rule"] == "exception.mylib.FlakyThing"
    assert classify(rs, tb("JSONDecodeError: x"))["category"] == "retryable"
    assert rs.version != RS.version
    assert classify(RS, tb("mylib.FlakyThing: x"))["category"] == "unknown"  # control


def test_exceptions_key_validated(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("version: 1\nexceptions:\n  'not a class': fatal\n  Foo: weird\n"
                 "  Bar: unknown\n")
    probs = [str(x).replace(str(p), "bad.yaml") for x in check_files([p], builtin=False)]
    assert probs[0].startswith("bad.yaml:3: exceptions: 'not a class'")
    assert probs[1].startswith("bad.yaml:4: exceptions.Foo: category must be")
    assert probs[2].startswith("bad.yaml:5: exceptions.Bar: category must be")
    p.write_text("version: 1\nexceptions: [a]\n")
    assert "must be a mapping" in str(check_files([p], builtin=False)[0])
