"""The benchmarks' data generators live in :mod:`rtindex.datagen`, so that ``rtindex demo``,
the notebooks and the tests use the very same data as the benchmarks."""

from rtindex.datagen import *  # noqa: F401,F403
from rtindex.datagen import __all__  # noqa: F401
