"""The one native part: faultwatch.rules._native (the matcher's fast path, Rust: native/).

Optional: where cargo is not found the build goes on without it, and every batch of lines
takes the matcher's pure-Python exact path (same results, several times the CPU; docs/rules.md
"Native fast path"). Everything else is in pyproject.toml.
"""

from setuptools import setup

try:
    from setuptools_rust import Binding, RustExtension
except ImportError:  # (a build without pyproject's build requirements)
    rust = []
else:
    rust = [RustExtension("faultwatch.rules._native", "native/Cargo.toml", binding=Binding.PyO3,
                          py_limited_api=True, optional=True, debug=False)]

setup(rust_extensions=rust)
