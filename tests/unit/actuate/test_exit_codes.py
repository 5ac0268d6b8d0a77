"""The agent's exit codes against the schedulers' own rules (item 4 of issue 10)."""

from __future__ import annotations

from faultwatch.agents.config import (
    EXIT_BLACKLISTED,
    EXIT_BOOTCHECK_FAILED,
    EXIT_FAILED_BY_DECISION,
    EXIT_NODES_TIMEOUT,
)


def kubeflow_is_retryable(code: int) -> bool:
    """Kubeflow training-operator's isRetryableExitCode (restartPolicy: ExitCode), as data:
    1, 2, 126, 127, 128, 139 permanent; 130, 137, 143 (signals) and 138 (SIGUSR1, reserved
    for user-defined retryable errors) retryable; everything else permanent."""
    return code in (130, 137, 143, 138)


def test_move_me_codes_are_retryable_and_stop_codes_are_not() -> None:
    # a bad node: the pod must be recreated (elsewhere, thanks to the taint), not failed
    assert kubeflow_is_retryable(EXIT_BLACKLISTED)
    assert kubeflow_is_retryable(EXIT_BOOTCHECK_FAILED)
    # never a signal's code: 138 is the one code Kubeflow reserves for users
    assert EXIT_BLACKLISTED not in (130, 137, 143)
    # a fail decision or peers that never came: permanent, a person looks
    assert not kubeflow_is_retryable(EXIT_FAILED_BY_DECISION)
    assert not kubeflow_is_retryable(EXIT_NODES_TIMEOUT)
    # all fit in an exit status and do not collide with the shell's 126/127/128
    codes = {EXIT_BLACKLISTED, EXIT_FAILED_BY_DECISION, EXIT_NODES_TIMEOUT}
    assert all(0 < c < 256 and c not in (126, 127, 128) for c in codes)
    assert len(codes) == 3
