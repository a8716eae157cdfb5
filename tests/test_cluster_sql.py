"""The SQL suites about answers, on a real Ray cluster of 2 storage nodes, each collection
in 4 shards (2 groups): the same records and generated queries as on one process, with the
same expected results (tests/test_sqllogic.py, tests/test_sql_differential.py), read by a
coordinator through the query actors and by one reading the groups in its own process.

The whole of both is slow; one sqllogic file and a few generated scenarios run by default.
"""

from __future__ import annotations

import duckdb
import pytest
import ray_cluster

import rtindex
import sqllogic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sql_differential import check_scenario
from test_sqllogic import RECORDS, _Loaded

SHARDS = 4
QUICK_FILE = "select.test"  # the default run's sqllogic file
ENGINES = ("index", "scan")


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory):
    with ray_cluster.started(str(tmp_path_factory.mktemp("cluster")), nodes=2, seal_rows=4) as (cluster, db):
        yield cluster, db


@pytest.fixture(scope="module", params=["actors", "local"])
def cluster_db(request, ray_nodes):
    """A coordinator reading through the query actors, or node-local (its own process)."""
    cluster, db = ray_nodes
    if request.param == "actors":
        yield db
        return
    local = rtindex.open_cluster(cluster.address, options={"seal_rows": 4}, local_reads=True)
    yield local
    local.close()


def _cases():
    for name, records in RECORDS.items():
        for n, rec in enumerate(records):
            if rec.loads_data:
                continue
            for engine in ENGINES:
                marks = [] if name == QUICK_FILE else [pytest.mark.slow]
                if "rtindex" in rec.skip:
                    marks.append(pytest.mark.skip(reason="not run on rtindex (skipif/onlyif)"))
                elif engine in rec.xfail:
                    marks.append(pytest.mark.xfail(reason=rec.xfail[engine], strict=True))
                yield pytest.param(name, n, engine, id=f"{rec.id}-{engine}", marks=marks)


@pytest.fixture(scope="module")
def engines(cluster_db):
    """file -> its tables loaded on the cluster up to some record (one file at a time: the
    tables of different files share names)."""
    current: dict[str, _Loaded] = {}

    def get(name: str, upto: int) -> _Loaded:
        have = current.get(name)
        if have is not None and any(r.loads_data for r in RECORDS[name][upto:have.applied]):
            have.engine.close()
            current.clear()
            have = None
        if have is None:
            for other in current.values():
                other.engine.close()
            current.clear()
            have = current[name] = _Loaded(sqllogic.RtindexEngine(db=cluster_db, shards=SHARDS), name)
        have.advance(upto)
        return have

    yield get
    for have in current.values():
        have.engine.close()


def test_the_quick_file_exists():
    assert QUICK_FILE in RECORDS


@pytest.mark.parametrize(("name", "n", "engine"), list(_cases()))
def test_record_on_a_cluster(engines, name, n, engine):
    loaded = engines(name, n)
    other_path = sqllogic.check(RECORDS[name][n], loaded.engine, engine)
    if other_path is not None:
        pytest.skip(f"rtindex cannot run this query on the {engine} path ({other_path}): checked on the other one")


@pytest.fixture(scope="module")
def duck():
    con = duckdb.connect()
    yield con
    con.close()


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                       HealthCheck.function_scoped_fixture])


@settings(max_examples=4, **_SETTINGS)
@given(data=st.data())
def test_generated_queries_on_a_cluster(cluster_db, duck, data):
    check_scenario(cluster_db, duck, data, shards=SHARDS)


@pytest.mark.slow
@settings(max_examples=40, **_SETTINGS)
@given(data=st.data())
def test_many_generated_queries_on_a_cluster(cluster_db, duck, data):
    check_scenario(cluster_db, duck, data, shards=SHARDS)
