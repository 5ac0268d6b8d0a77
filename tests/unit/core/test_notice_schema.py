"""Every notice the processor or a command publishes (fleet storm, refusal, diagnose) passes
the published decision JSON Schema: consumers validating it must not drop them."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

import faultwatch
from faultwatch.core.blast import Notice
from faultwatch.core.policy import Policy
from faultwatch.readers.diagnose import request
from faultwatch.streams.refusal_notices import RefusalNotices
from faultwatch.streams.storm import notice_decision
from faultwatch.wire import decision_to_dict

SCHEMA = json.loads((Path(faultwatch.__file__).parent / "schemas" / "decision.schema.json")
                    .read_text())


def test_every_notice_kind_passes_the_decision_schema() -> None:
    storm = notice_decision(Notice(episode=1, ts=100.0, jobs=16, nodes=16, of_jobs=20,
                                   of_nodes=20, cause="broker", evidence={"window_s": 30}),
                            Policy(), "v1")
    refused = RefusalNotices().take(("j", "n1", 0, "r"), "no_node_key", "unsigned", 100.0, "v1")
    diag = request({"job": "j", "attempt": 2, "run_id": "r"}, 100.0)
    for d in (storm, refused, diag):
        assert d is not None
        jsonschema.validate(decision_to_dict(d), SCHEMA)
