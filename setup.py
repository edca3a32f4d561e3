"""Builds the optional landlock launcher (``stockade.sandbox._jail``).

Everything else is in pyproject.toml. Without a C compiler the build skips
the extension (``optional=True``) and the landlock backend forks Python
instead: the same confinement, about a millisecond slower per item.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "stockade.sandbox._jail",
            ["src/stockade/sandbox/_jail.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
        )
    )

setup(ext_modules=ext_modules)
