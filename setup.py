"""Build the Cython extensions; all metadata lives in pyproject.toml.

RTINDEX_DEBUG=1 turns bounds/wraparound checks back on and builds with -O0 -g.
RTINDEX_SANITIZE=1 adds AddressSanitizer (run python with LD_PRELOAD=libasan.so).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("RTINDEX_DEBUG") == "1"
SANITIZE = os.environ.get("RTINDEX_SANITIZE") == "1"

compile_args = ["-O0", "-g"] if DEBUG else ["-O3"]
link_args = []
if SANITIZE:
    compile_args += ["-fsanitize=address", "-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address"]

directives = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "binding": True,
    "embedsignature": True,
}

MODULES = ["_segment", "_blocks", "_lru", "_notify", "_point", "_gather", "_groups"]

extensions = [
    Extension(
        f"rtindex._ext.{name}",
        [f"rtindex/_ext/{name}.pyx"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for name in MODULES
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
