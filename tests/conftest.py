"""Shared fixtures: a database per test (closed at teardown), hypothesis profiles, a seeded rng."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, settings

import rtindex

settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=60, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def db(tmp_path):
    """A fresh database with small segments, so tests exercise sealing and merging."""
    d = rtindex.open(str(tmp_path / "db"), seal_rows=64)
    yield d
    d.close()


@pytest.fixture
def open_db(tmp_path):
    """Open (and at teardown close) databases at tmp_path/db with the given options."""
    opened = []

    def _open(**opts):
        opts.setdefault("seal_rows", 64)
        d = rtindex.open(str(tmp_path / "db"), **opts)
        opened.append(d)
        return d

    yield _open
    for d in opened:
        d.close()


class SeededRandom(random.Random):
    def __init__(self, seed: int):
        super().__init__(seed)
        self.seed_value = seed

    def __repr__(self) -> str:
        return f"SeededRandom(seed={self.seed_value})"


@pytest.fixture
def rand(request):
    """A random.Random whose repr (shown in failures) gives the seed to replay with RTINDEX_SEED."""
    seed = int(os.environ.get("RTINDEX_SEED", random.randrange(1 << 30)))
    return SeededRandom(seed)


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """A real Kafka broker for the module (tests/kafka_broker.py), stopped at its end;
    skipped where it cannot run (no Java 17+)."""
    from tests.kafka_broker import Broker, why_not

    if why_not() is not None:
        pytest.skip(why_not())
    b = Broker(tmp_path_factory.mktemp("kafka"))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def kafka(kafka_broker):
    """The module's broker, started again if an earlier test left it down."""
    return kafka_broker.start()
