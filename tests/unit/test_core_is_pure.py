"""The pure core and the rule engine must not import Kafka or Faust (or torch)."""

from __future__ import annotations

import subprocess
import sys

PURE = ["faultwatch.core.job", "faultwatch.core.matching", "faultwatch.core.policy",
        "faultwatch.core.root", "faultwatch.rules"]


def test_core_imports_no_kafka_faust_or_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
          "('faust', 'aiokafka', 'kafka', 'torch', 'mode'))\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure core imported: {out.stdout.strip()}"
