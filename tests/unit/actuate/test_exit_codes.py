"""The agent's exit codes against the schedulers' own rules (issue 10 item 4, issue 21 item 1).

The real-process rows are in tests/e2e/test_exit_contract.py; this checks the numbers."""

from __future__ import annotations

import signal

from faultwatch.agents.exitcodes import (
    EXIT_ELSEWHERE,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_SUCCESS,
    EXIT_UNDECIDED,
    VERDICTS,
    Verdict,
)


def kubeflow_is_retryable(code: int) -> bool:
    """Kubeflow training-operator's isRetryableExitCode (restartPolicy: ExitCode), as data:
    1, 2, 126, 127, 128, 139 permanent; 130, 137, 143 (signals) and 138 (SIGUSR1, reserved
    for user-defined retryable errors) retryable; everything else permanent."""
    return code in (130, 137, 143, 138)


def test_move_me_is_kubeflow_retryable_and_stop_codes_are_not() -> None:
    assert kubeflow_is_retryable(EXIT_ELSEWHERE)
    assert EXIT_ELSEWHERE not in (130, 137, 143)  # never a stop signal's code
    for permanent in (EXIT_FAILED, EXIT_NODES_TIMEOUT, EXIT_UNDECIDED, EXIT_RESTART):
        assert not kubeflow_is_retryable(permanent), permanent


def test_codes_are_distinct_and_none_is_what_python_or_a_shell_produce_alone() -> None:
    # each non-zero code means one thing; 0 is "nothing for the scheduler to do": the command
    # succeeded, a hot spare replaced this node, or a spare was not needed (the verdict file
    # says which; 0 leaves a step's or a Job's result to the nodes that train)
    done = {name for name, code in VERDICTS.items() if code == EXIT_SUCCESS}
    assert done == {"success", "replaced", "released"}
    codes = [code for code in VERDICTS.values() if code != EXIT_SUCCESS]
    assert len(set(codes)) == len(codes)
    own = {1, 2, 126, 127, 128, 255}  # a Python traceback, argparse, a shell, exit(-1)
    deaths = {128 + s for s in range(1, 65)}  # killed by any signal, real-time ones included
    for name, code in VERDICTS.items():
        if name == "elsewhere":  # Kubeflow forces 138: the agent handles SIGUSR1 instead
            assert code == 128 + signal.SIGUSR1
            continue
        assert code == EXIT_SUCCESS or code not in own | deaths | set(range(3, 7)), name


def test_the_verdict_reports_the_childs_own_code_and_signal() -> None:
    v = Verdict("failed", EXIT_FAILED, why="a fail decision", child_exit_code=138,
                child_signal=int(signal.SIGUSR1), decision={"id": "d1", "action": "fail",
                                                             "kind": "exit", "rule": None},
                job="j", node="n", run_id="r", attempt=2)
    d = v.to_dict()
    assert d["exit_code"] == 78 and d["child"] == {"exit_code": 138, "signal": 10,
                                                   "signal_name": "SIGUSR1"}
    assert d["decision"]["id"] == "d1" and d["attempt"] == 2 and d["run_id"] == "r"
    line = v.sentence()
    assert "verdict failed (exit 78)" in line and "killed by SIGUSR1 (code 138)" in line
    assert "\n" not in line
