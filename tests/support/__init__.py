"""Helpers shared by the tests, one module per kind of thing; test modules import from here,
never from one another (tests/unit/test_test_layout.py guards that).

waiting          wait_until: the one way to wait for an event (what, last value seen)
processes        the faultwatch executable, torchrun, the job environment, `fw ARGS`
kafka            reading and writing topics directly (consume, produce, read_all, read_topic)
agents           `faultwatch agent` command lines, decisions for it to follow
signed_decisions an agent with a decision key, raw decision records
cluster          a `faultwatch process` worker, its log events, decisions, caught-up waits
scenarios        detector scenarios: policy files, scripted jobs, agents started by a test
pushed_rules     a site rule and the failure it matches, fed as an agent would
notify           a webhook receiver and decision records for the notifier
rules            the built-in rule set, loaded once per session
job_events       events applied to the pure job state machine (unit tests)
flight_recorder  hand-made Flight Recorder dumps
k8s, slurm       a real Kubernetes API server and a real Slurm cluster on this machine
secure_site      a secured site on `faultwatch kafka up --secure`: keys, trust, role clients
"""
