"""The node side installs and imports without Faust; `faultwatch process` says what is missing."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from faultwatch.errors import EXIT_MISSING_EXTRA

REPO = Path(__file__).resolve().parents[3]
# Modules of the processor's Faust shell: the only ones that may import faust at module level.
PROCESSOR_ONLY = re.compile(r"^faultwatch\.streams\.(app|faust\w*|worker)$")
# Framework callbacks import their framework (transformers, lightning): users of a framework
# import its callback; tests/integration/test_integrations.py runs them in the training env.
NODE_SKIP = r"^faultwatch\.(streams\.(app|faust\w*|worker)|integrations\.\w+)$"

# Runs in a fresh interpreter where `import faust` fails as in a node-side install.
BLOCK_FAUST = """
import sys
for name in ("faust", "mode"):
    sys.modules[name] = None  # import raises ImportError; find_spec returns None
"""

IMPORT_ALL = BLOCK_FAUST + """
import importlib, pkgutil, re
import faultwatch
skip = re.compile(sys.argv[1])
failed, imported = [], []
for m in pkgutil.walk_packages(faultwatch.__path__, "faultwatch."):
    if skip.match(m.name) or m.name.endswith(".__main__"):
        continue
    try:
        importlib.import_module(m.name)
        imported.append(m.name)
    except ImportError as e:
        if e.name is None or e.name.split(".")[0] in ("faust", "mode"):
            failed.append(f"{m.name}: {type(e).__name__}: {e}")
        # else: an integration whose framework is not installed here (e.g. lightning);
        # tests/e2e/test_coinstall.py imports those in a training image
    except Exception as e:
        failed.append(f"{m.name}: {type(e).__name__}: {e}")
print(len(imported))
print("\\n".join(failed))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_every_node_side_module_imports_without_faust() -> None:
    out = _run(IMPORT_ALL, NODE_SKIP)
    assert out.returncode == 0, out.stderr
    count, *failed = out.stdout.strip().splitlines()
    assert [f for f in failed if f] == []
    assert int(count) > 40  # the walk really imported the package


def test_the_blocker_really_blocks_faust() -> None:
    """Positive control: the Faust shell itself fails to import under the same blocker."""
    import faultwatch

    shell = [m.name for m in pkgutil.walk_packages(faultwatch.__path__, "faultwatch.")
             if PROCESSOR_ONLY.match(m.name)]
    assert shell, "no Faust shell module found: update PROCESSOR_ONLY"
    out = _run(BLOCK_FAUST + "\n".join(f"import {m}" for m in shell))
    assert out.returncode != 0 and "import of faust halted" in out.stderr, out.stderr


def test_process_without_the_processor_extra_exits_with_its_code() -> None:
    code = BLOCK_FAUST + (
        "from faultwatch.cli import main\n"
        "sys.exit(main(['process', '--bootstrap', '127.0.0.1:1']))\n")
    out = _run(code)
    assert out.returncode == EXIT_MISSING_EXTRA, out.stderr
    assert "faultwatch[processor]" in out.stderr and "faust" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_faust_is_only_in_the_processor_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("faust")]
    assert any(d.startswith("faust-streaming") for d in
               project["optional-dependencies"]["processor"])
    # node-side pins stay loose: no exact pins, so it installs beside any training stack
    assert not [d for d in project["dependencies"] if "==" in d.split(";")[0]]
