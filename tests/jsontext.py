"""Shared hypothesis strategies for tests that feed documents as JSON text.

- Python values to serialize (``documents()``, ``REPEATING``, the scalar strategies): only
  what every serializer below writes (str without lone surrogates, ints that fit 64 bits,
  finite floats), so that every serialization of a document means the same thing.
- ``SERIALIZERS``: orjson and ``json.dumps`` variants (whitespace, ``ensure_ascii`` escapes,
  indentation) and random whitespace between tokens; ``FAMILY`` groups the ones whose arrays
  have the same text once the whitespace outside strings is removed.
- Hostile input: the table and mutation strategy of tests/test_jsonparse.py (re-exported
  here), and number texts.
"""

from __future__ import annotations

import json
import random

import orjson
from hypothesis import strategies as st

from rtindex import keys
from tests.test_jsonparse import (  # noqa: F401 - re-exported
    HOSTILE,
    MUTATION,
    SOURCES,
    TRUNCATED,
    UTF8_EDGES,
    _spaced,
    mutate,
)

# ---------------------------------------------------------------- values


@st.composite
def rarely(draw, common, rare, one_in: int):
    """``rare`` about once in ``one_in`` draws, else ``common``."""
    return draw(rare if draw(st.integers(1, one_in)) == 1 else common)


NAMES = st.one_of(
    st.sampled_from(["a", "b", "c", "x_1", "_event_time", "a.b", "", "a b", "1a", "\x00", "a\x00",
                     "\x00\xff", "é", "😀", "a\n", "A", "_", '"', "\\", "\u2028"]),
    st.text(max_size=4),  # (no surrogates: hypothesis leaves them out of text())
)
STRINGS = st.one_of(
    st.sampled_from(["", "x", "y", "\x00", "a\x00b", "\x00\xff", "é", "😀", "\U0010ffff", "a" * 70,
                     '"', "\\", "/", "\n\t\r\b\f", "\x1f\x7f", "\u2028\u2029", "\ufeff"]),
    st.text(max_size=8),
)
INTS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([keys.INT_MIN, keys.INT_MAX, keys.INT_MIN + 1, keys.INT_MAX - 1, 2**32, 2**31 - 1, -(2**31),
                     2**53, 2**53 + 1, -(2**53) - 1]),
    st.integers(keys.INT_MIN, keys.INT_MAX),
)
# Integers past int64 that every serializer here still writes (orjson: up to 2**64 - 1): refused.
OUT_OF_RANGE_INTS = st.sampled_from([2**63, 2**63 + 1, 2**64 - 1])
FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.5, -1.5, 1.0, 5e-324, -5e-324, 1.7976931348623157e308, -1.7976931348623157e308,
                     2.2250738585072014e-308, 2.225073858507201e-308, 1e16, 1e-7, 9007199254740993.0, 0.1, 1e22,
                     1e23, 123456789012345680.0]),
    st.floats(allow_nan=False, allow_infinity=False),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, STRINGS)


def _containers(children):
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(NAMES, children, max_size=4))


VALUES = st.recursive(rarely(SCALARS, OUT_OF_RANGE_INTS, 40), _containers, max_leaves=16)
EVENT_TIMES = st.one_of(INTS, FLOATS, STRINGS, st.lists(INTS, max_size=2), st.none(), st.booleans(),
                        st.just({"x": 1}), OUT_OF_RANGE_INTS)


@st.composite
def documents(draw):
    """A document (a dict): generated names and values, maybe a top-level ``_event_time``
    (``NAMES`` puts one below the top too)."""
    doc = draw(st.dictionaries(NAMES, VALUES, max_size=8))
    if draw(st.booleans()):
        doc["_event_time"] = draw(EVENT_TIMES)
    return doc


# A few fixed shapes with small value pools, so that terms repeat across documents.
REPEATING = st.fixed_dictionaries(
    {"k": st.sampled_from(["x", "y", "\x00"]), "n": st.integers(0, 3), "f": st.sampled_from([0.0, -0.0, 1.5])},
    optional={
        "arr": st.lists(st.sampled_from([1, 2, "x", None, True]), max_size=3),
        "o": st.fixed_dictionaries({"p": st.booleans()}, optional={"q": st.sampled_from([[1], {"r": None}])}),
        "_event_time": st.integers(0, 3),
    },
)

# ---------------------------------------------------------------- serializers


def _spaced_seeded(doc) -> bytes:
    return _spaced(doc, random.Random(repr(doc))).encode()


# name -> bytes of a document; FAMILY: serializers whose arrays have the same compact text
SERIALIZERS = {
    "orjson": orjson.dumps,
    "orjson_indent": lambda d: orjson.dumps(d, option=orjson.OPT_INDENT_2),
    "json": lambda d: json.dumps(d).encode(),
    "json_indent": lambda d: json.dumps(d, indent=2).encode(),
    "json_utf8": lambda d: json.dumps(d, ensure_ascii=False).encode(),
    "json_utf8_compact": lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode(),
    "json_utf8_tabs": lambda d: json.dumps(d, indent="\t", ensure_ascii=False,
                                           separators=(" ,\r\n", " : ")).encode(),
    "spaced": _spaced_seeded,  # whitespace runs between all tokens, ensure_ascii at random
}
FAMILY = {"orjson": "orjson", "orjson_indent": "orjson", "json": "ascii", "json_indent": "ascii",
          "json_utf8": "utf8", "json_utf8_compact": "utf8", "json_utf8_tabs": "utf8", "spaced": "spaced"}
SERIALIZER_NAMES = st.sampled_from(sorted(SERIALIZERS))


@st.composite
def json_documents(draw, docs=None):
    """One document as JSON bytes, by a serializer drawn from ``SERIALIZERS``."""
    doc = draw(documents() if docs is None else docs)
    return SERIALIZERS[draw(SERIALIZER_NAMES)](doc)


# ---------------------------------------------------------------- hostile text


MUTATED = st.builds(mutate, SOURCES, st.lists(MUTATION, min_size=1, max_size=3))
HOSTILE_TEXTS = st.sampled_from([raw for raw, *_ in HOSTILE])

# Number texts: the grammar's edges (long mantissas, huge and tiny exponents, -0) and
# near-misses. A document holds one as a value and as an array element.
NUMBER_TEXTS = st.one_of(
    st.from_regex(r"\A-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?\Z"),
    st.sampled_from([
        "0", "-0", "-0.0", "0e0", "0E-0", "1e-400", "-1e-400", "1e308", "1.7976931348623157e308",
        "1.7976931348623158e308", "1.7976931348623159e308", "4.9406564584124654e-324", "2.4703282292062327e-324",
        "2.4703282292062328e-324", "2.2250738585072011e-308", "2.2250738585072012e-308",
        "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
        "00", "01", "-", "1.", ".5", "1e", "1e+", "+1", "1.5e3", "123456789012345678901234567890",
        "0.1000000000000000055511151231257827", "9007199254740993", "9007199254740993.0",
        "1" + "0" * 400 + ".5", "0." + "0" * 400 + "1", "1e99999", "1e-99999",
    ]),
)
