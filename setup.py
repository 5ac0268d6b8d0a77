"""The one native part: faultwatch.rules._batchscan (the matcher's rank-prefix reading in C).

Optional: where no C compiler is found the build goes on without it and the matcher uses its
pure-Python reading (same results; rules/native.py). Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("faultwatch.rules._batchscan", ["faultwatch/rules/_batchscan.c"],
                             optional=True, extra_compile_args=["-O2"])])
