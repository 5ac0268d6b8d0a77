"""Stacks that show a rank working outside communication: I/O (an upload through an HTTP
client or an object-store SDK), compiling (torch.compile), and a background thread doing
either while the main thread waits for it."""

from __future__ import annotations

from faultwatch.dumps import stacks


def thread(name: str, frames: list[tuple[str, str, int]], active: bool = False,
           main: bool = False) -> dict:
    return {"thread_name": name, "active": active, **({"main": True} if main else {}),
            "frames": [{"name": f, "filename": p, "line": n} for f, p, n in frames]}


SITE = "/venv/lib/python3.11/site-packages"
LIB = "/usr/lib/python3.11"


def test_an_upload_through_an_http_client_is_io() -> None:
    a = stacks.classify(0, [thread("MainThread", [
        ("send", f"{LIB}/http/client.py", 1050), ("request", f"{LIB}/http/client.py", 1300),
        ("upload", "/job/ckpt.py", 12)], main=True)])
    assert (a.state, a.op, a.at, a.idle) == ("io", "send", "ckpt.py:12 in upload", True)
    a = stacks.classify(0, [thread("MainThread", [
        ("_send_request", f"{SITE}/botocore/endpoint.py", 200), ("put", "/job/up.py", 3)])])
    assert a.state == "io"


def test_torch_compile_is_compiling() -> None:
    a = stacks.classify(0, [thread("MainThread", [
        ("compile_fx", f"{SITE}/torch/_inductor/compile_fx.py", 700),
        ("_fn", f"{SITE}/torch/_dynamo/eval_frame.py", 600), ("step", "/job/t.py", 9)],
        active=True)])
    assert (a.state, a.idle) == ("compile", False)


def test_a_main_thread_joining_an_uploading_thread_names_that_thread() -> None:
    a = stacks.classify(0, [
        thread("MainThread", [("wait", f"{LIB}/threading.py", 320),
                              ("join", f"{LIB}/threading.py", 1100),
                              ("finish", "/job/t.py", 30)], main=True),
        thread("uploader", [("sendall", f"{LIB}/ssl.py", 1200),
                            ("send", f"{LIB}/http/client.py", 1050), ("push", "/job/t.py", 50)]),
        thread("metrics", [("accept", f"{LIB}/socket.py", 290),
                           ("serve_forever", f"{LIB}/socketserver.py", 230)]),
        thread("tqdm", [("wait", f"{LIB}/threading.py", 320)])])
    assert a.state == "elsewhere"
    assert a.others == ("uploader: io in send at ssl.py:1200 in sendall",)
    back = stacks.RankActivity.from_dict(0, a.to_dict())
    assert back == a


def test_collectives_still_win_and_old_digests_still_read() -> None:
    a = stacks.classify(0, [thread("MainThread", [
        ("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2500),
        ("recv_into", f"{LIB}/socket.py", 700), ("step", "/job/t.py", 9)])])
    assert a.state == "collective"
    old = stacks.RankActivity.from_dict(1, {"state": "elsewhere", "at": "t.py:1 in f"})
    assert old.others == () and "others" not in old.to_dict()
    assert stacks.RankActivity.from_dict(1, {"state": "bogus"}).state == "unknown"
