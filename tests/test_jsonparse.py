"""rtindex._py.jsonparse: valid JSON parses as json.loads does, hostile JSON fails with the
exact error (message and path), mutated documents never slip past the strict rules.

``HYPOTHESIS_PROFILE`` (see conftest.py) overrides the example counts set here.
"""

from __future__ import annotations

import json
import math
import os
import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex import keys
from rtindex._py.jsonparse import RawList, parse_document
from rtindex.errors import SchemaError


def _settings(max_examples: int) -> settings:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return settings()  # the profile loaded by conftest.py decides
    return settings(max_examples=max_examples, deadline=None)


TEXT = st.one_of(
    st.text(max_size=8),  # no surrogates: they cannot be encoded
    st.text(alphabet=st.sampled_from(["\x00", "\x1f", "\x7f", '"', "\\", "/", "\n", "é", "\u2028",
                                      "\uffff", "😀", "\U0010ffff", " ", "a"]), max_size=6),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(keys.INT_MIN, keys.INT_MAX),
    st.sampled_from([keys.INT_MIN, keys.INT_MAX, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),  # +-0.0, subnormals, 1e308 included
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
    max_leaves=20,
)
DOCS = st.dictionaries(TEXT, VALUES, max_size=5)


def _same(a, b) -> bool:
    """Equal values of the same types (dict order and the sign of zero included)."""
    if isinstance(a, dict):
        return (type(b) is dict and list(a) == list(b)
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return type(b) is float and a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def _lists(v):
    """Every list in ``v`` (depth first)."""
    if isinstance(v, dict):
        for x in v.values():
            yield from _lists(x)
    elif isinstance(v, list):
        yield v
        for x in v:
            yield from _lists(x)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def _spaced(v, rnd: random.Random) -> str:
    """``v`` as JSON with random whitespace runs between all tokens."""
    def ws() -> str:
        return "".join(rnd.choice(" \t\n\r") for _ in range(rnd.choice([0, 0, 1, 3])))

    if isinstance(v, dict):
        inner = ",".join(f"{ws()}{json.dumps(k)}{ws()}:{ws()}{_spaced(x, rnd)}{ws()}" for k, x in v.items())
        return "{" + (inner or ws()) + "}"
    if isinstance(v, list):
        return "[" + (",".join(f"{ws()}{_spaced(x, rnd)}{ws()}" for x in v) or ws()) + "]"
    return json.dumps(v, ensure_ascii=rnd.random() < 0.5)


# ---------------------------------------------------------------- valid documents


@given(DOCS, st.randoms(use_true_random=False))
@_settings(100)
def test_valid_documents_parse_as_json_loads_does(doc, rnd):
    depth = max(64, _depth(doc))
    compact_json = lambda ascii_only: lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=ascii_only)
    compact_orjson = lambda v: orjson.dumps(v).decode()
    serialized = [  # (text, the compact text of each of its lists, or None)
        (json.dumps(doc).encode(), compact_json(True)),
        (json.dumps(doc, ensure_ascii=False).encode(), compact_json(False)),
        (json.dumps(doc, indent=2).encode(), compact_json(True)),
        (json.dumps(doc, indent="\t", ensure_ascii=False, separators=(" ,\r\n", " : ")).encode(),
         compact_json(False)),
        (json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode(), compact_json(False)),
        (_spaced(doc, rnd).encode(), None),
        (orjson.dumps(doc), compact_orjson),
        (orjson.dumps(doc, option=orjson.OPT_INDENT_2), compact_orjson),
    ]
    for raw, compact in serialized:
        got = parse_document(raw, max_depth=depth)
        assert _same(got, json.loads(raw)), raw
        for lst in _lists(got):
            assert type(lst) is RawList
            assert _same(json.loads(lst.json), lst)
            assert not any(c in lst.json for c in "\n\r\t")  # strings escape these
            if compact is not None:
                assert lst.json == compact(list(lst))


def test_raw_list_text():
    doc = parse_document(b'{"a": [1, "a b" ,\n{"x" : [ ]}, ["\\u00e9", "\\" ]"], \t\r\n[]\n]}')
    assert doc == {"a": [1, "a b", {"x": []}, ["é", '" ]'], []]}
    assert doc["a"].json == '[1,"a b",{"x":[]},["\\u00e9","\\" ]"],[]]'
    assert doc["a"][2]["x"].json == "[]"
    assert doc["a"][3].json == '["\\u00e9","\\" ]"]'
    assert parse_document('{"é":["é ü"]}'.encode())["é"].json == '["é ü"]'


VALID = [
    (b'{"a":9223372036854775807}', {"a": keys.INT_MAX}),
    (b'{"a":-9223372036854775808}', {"a": keys.INT_MIN}),
    (b'{"a":1e-400}', {"a": 0.0}),
    (b'{"a":-0}', {"a": 0}),
    (b'{"a":-0.0}', {"a": -0.0}),
    (b'{"a":1E2,"b":0e0,"c":1.5e+3,"d":2E-1}', {"a": 100.0, "b": 0.0, "c": 1500.0, "d": 0.2}),
    (b'{"a":9223372036854775808.0}', {"a": 9223372036854775808.0}),
    (b'{"a":1e308}', {"a": 1e308}),
    (b'{"a":true,"b":false,"c":null}', {"a": True, "b": False, "c": None}),
    (b' \t\r\n{ } \t\r\n', {}),
    (b'{"a":"\x7f"}', {"a": "\x7f"}),
    (b'{"a":"\\"\\\\\\/\\b\\f\\n\\r\\t"}', {"a": '"\\/\b\f\n\r\t'}),
    (b'{"a":"\\u00e9\\u00E9"}', {"a": "éé"}),
    (b'{"a":"\\u0000"}', {"a": "\x00"}),
    (b'{"a":"\\udbff\\udfff"}', {"a": "\U0010ffff"}),
    (b'{"\\uD83D\\uDE00":"\\uD83D\\uDE00x"}', {"😀": "😀x"}),
    (b'{"a":"\xf4\x8f\xbf\xbf\xef\xbf\xbf\xed\x9f\xbf\xee\x80\x80\xc2\x80"}',
     {"a": "\U0010ffff\uffff\ud7ff\ue000\x80"}),
    (b'{"x":[{"b":1},{"b":2}]}', {"x": [{"b": 1}, {"b": 2}]}),
    (b'{"a":{"a":1},"b":{"a":2}}', {"a": {"a": 1}, "b": {"a": 2}}),
    (b'{"b":1,"a":2}', {"b": 1, "a": 2}),
]


@pytest.mark.parametrize("raw,expected", VALID, ids=[r.decode("latin-1") for r, _ in VALID])
def test_valid_edge_cases(raw, expected):
    assert _same(parse_document(raw), expected)


def test_depth_limit_default():
    ok = b'{"a":' + b"[" * 63 + b"]" * 63 + b"}"  # root at level 1, the deepest array at 64
    assert _depth(parse_document(ok)) == 64
    with pytest.raises(SchemaError) as e:
        parse_document(b'{"a":' + b"[" * 64 + b"]" * 64 + b"}")
    assert (e.value.message, e.value.path) == ("nesting deeper than 64 levels", "$.a" + "[0]" * 63)


# ---------------------------------------------------------------- hostile documents


def J(pos: int, what: str) -> str:
    return f"invalid JSON at byte {pos}: {what}"


EOF = "unexpected end of input"
NAN = "NaN and Infinity are not JSON numbers"
NUM = "invalid number"
CTRL = "control character in a string"
UTF8 = "invalid UTF-8 in a string"
KEY = "expected a string key"
OBJ_NEXT = "expected ',' or '}' after an object member"
ARR_NEXT = "expected ',' or ']' after an array element"
LONE = "string is not valid UTF-8 (lone surrogate)"
KEY_LONE = "key is not valid UTF-8 (lone surrogate)"
DUP = "duplicate key in an object"
RANGE = "integer outside the signed 64-bit range"
INF = "non-finite number inf (JSON has no NaN or Infinity)"


def _not(kind: str) -> str:
    return f"a document must be a JSON object, not {kind}"


# (input, message, path, max_depth)
HOSTILE = [
    # the document
    (b"", "empty document", "$", 64),
    (b" \t\r\n ", "empty document", "$", 64),
    (b"[]", _not("an array"), "$", 64),
    (b' "x"', _not("a string"), "$", 64),
    (b'"', _not("a string"), "$", 64),
    (b"-", _not("a number"), "$", 64),
    (b"-Infinity", _not("a number"), "$", 64),
    (b"12", _not("a number"), "$", 64),
    (b"0x", _not("a number"), "$", 64),
    (b"true", _not("a boolean"), "$", 64),
    (b"fals", _not("a boolean"), "$", 64),
    (b"nul", _not("null"), "$", 64),
    (b"NaN", J(0, NAN), "$", 64),
    (b"  Infinity", J(2, NAN), "$", 64),
    (b"}", J(0, "unexpected character '}'"), "$", 64),
    (b"'a'", J(0, "unexpected character '''"), "$", 64),
    (b"\xef\xbb\xbf{}", J(0, "unexpected byte 0xef"), "$", 64),
    (b"\x00{}", J(0, "unexpected byte 0x00"), "$", 64),
    (b"\x0c{}", J(0, "unexpected byte 0x0c"), "$", 64),  # form feed is not whitespace
    (b"{} x", J(3, "unexpected content after the document"), "$", 64),
    (b"{}{}", J(2, "unexpected content after the document"), "$", 64),
    (b"{}\x00", J(2, "unexpected content after the document"), "$", 64),
    (b"{", J(1, EOF), "$", 64),
    (b"{  ", J(3, EOF), "$", 64),
    # objects
    (b'{"a"', J(4, EOF), "$", 64),
    (b'{"a" 1}', J(5, "expected ':' after an object key"), "$", 64),
    (b'{"a"=1}', J(4, "expected ':' after an object key"), "$", 64),
    (b'{"a":}', J(5, "unexpected character '}'"), "$", 64),
    (b'{"a":', J(5, EOF), "$", 64),
    (b'{"a": \n', J(7, EOF), "$", 64),
    (b'{"a":1,}', J(7, KEY), "$", 64),
    (b'{"a":1, }', J(8, KEY), "$", 64),
    (b'{,}', J(1, KEY), "$", 64),
    (b'{a:1}', J(1, KEY), "$", 64),
    (b"{'a':1}", J(1, KEY), "$", 64),
    (b'{"a":1 "b":2}', J(7, OBJ_NEXT), "$", 64),
    (b'{"a":1;', J(6, OBJ_NEXT), "$", 64),
    (b'{"a":1x}', J(6, OBJ_NEXT), "$", 64),
    (b'{"a":truex}', J(9, OBJ_NEXT), "$", 64),
    (b'{"a":1', J(6, EOF), "$", 64),
    (b'{"a":1,', J(7, EOF), "$", 64),
    (b'{"a":1]', J(6, OBJ_NEXT), "$", 64),
    # arrays
    (b'{"a":[1,]}', J(8, "unexpected character ']'"), "$", 64),
    (b'{"a":[,1]}', J(6, "unexpected character ','"), "$", 64),
    (b'{"a":[1 2]}', J(8, ARR_NEXT), "$", 64),
    (b'{"a":[1}', J(7, ARR_NEXT), "$", 64),
    (b'{"a":[01]}', J(7, ARR_NEXT), "$", 64),
    (b'{"a":[', J(6, EOF), "$", 64),
    (b'{"a":[1', J(7, EOF), "$", 64),
    (b'{"a":[1,', J(8, EOF), "$", 64),
    (b'{"a":[1, ', J(9, EOF), "$", 64),
    # numbers
    (b'{"a":01}', J(6, OBJ_NEXT), "$", 64),
    (b'{"a":-01}', J(7, OBJ_NEXT), "$", 64),
    (b'{"a":1.}', J(7, NUM), "$", 64),
    (b'{"a":1.', J(7, NUM), "$", 64),
    (b'{"a":1.e5}', J(7, NUM), "$", 64),
    (b'{"a":.5}', J(5, "unexpected character '.'"), "$", 64),
    (b'{"a":+1}', J(5, "unexpected character '+'"), "$", 64),
    (b'{"a":-}', J(6, NUM), "$", 64),
    (b'{"a":-', J(6, NUM), "$", 64),  # pos == len(raw), still invalid number
    (b'{"a":- 1}', J(6, NUM), "$", 64),
    (b'{"a":-NaN}', J(6, NUM), "$", 64),
    (b'{"a":1e}', J(7, NUM), "$", 64),
    (b'{"a":1e', J(7, NUM), "$", 64),
    (b'{"a":1e+}', J(8, NUM), "$", 64),
    (b'{"a":1E-', J(8, NUM), "$", 64),
    (b'{"a":0x10}', J(6, OBJ_NEXT), "$", 64),
    (b'{"a":NaN}', J(5, NAN), "$", 64),
    (b'{"a":Infinity}', J(5, NAN), "$", 64),
    (b'{"a":-Infinity}', J(5, NAN), "$", 64),
    (b'{"a":-I', J(5, NAN), "$", 64),
    (b'{"a":[Inf', J(6, NAN), "$", 64),
    (b'{"a":9223372036854775808}', RANGE, "$.a", 64),
    (b'{"a":-9223372036854775809}', RANGE, "$.a", 64),
    (b'{"a":18446744073709551616}', RANGE, "$.a", 64),
    (b'{"a":[' + b"1" * 5000 + b"]}", RANGE, "$.a[0]", 64),
    (b'{"a":[0, 99999999999999999999', RANGE, "$.a[1]", 64),  # before the end of input
    (b'{"a":1e400}', INF, "$.a", 64),
    (b'{"a":-1e400}', "non-finite number -inf (JSON has no NaN or Infinity)", "$.a", 64),
    (b'{"a":{"b":1' + b"0" * 400 + b".5", INF, "$.a.b", 64),
    (b'{"a":1e400', INF, "$.a", 64),
    # literals
    (b'{"a":tru}', J(5, "unexpected character 't'"), "$", 64),
    (b'{"a":tru', J(5, "unexpected character 't'"), "$", 64),
    (b'{"a":fals', J(5, "unexpected character 'f'"), "$", 64),
    (b'{"a":nul', J(5, "unexpected character 'n'"), "$", 64),
    (b'{"a":nulL}', J(5, "unexpected character 'n'"), "$", 64),
    (b'{"a":True}', J(5, "unexpected character 'T'"), "$", 64),
    (b'{"a":undefined}', J(5, "unexpected character 'u'"), "$", 64),
    (b'{"a":\\}', J(5, "unexpected character '\\'"), "$", 64),
    (b'{"a":\xc3\xa9}', J(5, "unexpected byte 0xc3"), "$", 64),
    (b'{"a":\x7f}', J(5, "unexpected byte 0x7f"), "$", 64),
    # strings
    (b'{"a":"x', J(7, EOF), "$", 64),
    (b'{"a', J(3, EOF), "$", 64),
    (b'{"a":"\x01"}', J(6, CTRL), "$", 64),
    (b'{"a":"\t"}', J(6, CTRL), "$", 64),
    (b'{"a\n":1}', J(3, CTRL), "$", 64),
    (b'{"a":"\x1f', J(6, CTRL), "$", 64),
    (b'{"a":"\\x"}', J(6, "invalid escape"), "$", 64),
    (b'{"a":"\\U0041"}', J(6, "invalid escape"), "$", 64),
    (b'{"a":"\\\x01"}', J(6, "invalid escape"), "$", 64),
    (b'{"a":"\\', J(7, EOF), "$", 64),
    (b'{"a":"\\u12"}', J(6, "invalid \\u escape"), "$", 64),
    (b'{"a":"\\u12G', J(6, "invalid \\u escape"), "$", 64),  # digit by digit: G before the end
    (b'{"a":"\\u 123"}', J(6, "invalid \\u escape"), "$", 64),
    (b'{"a":"\\u', J(8, EOF), "$", 64),
    (b'{"a":"\\u12', J(10, EOF), "$", 64),
    (b'{"a":"\\u123', J(11, EOF), "$", 64),
    # surrogates from escapes
    (b'{"a":"\\uD800"}', LONE, "$.a", 64),
    (b'{"a":"\\udc00"}', LONE, "$.a", 64),
    (b'{"a":"x\\uDFFF', LONE, "$.a", 64),
    (b'{"a":"\\uD800\\u0041"}', LONE, "$.a", 64),
    (b'{"a":"\\uD800\\uD800"}', LONE, "$.a", 64),
    (b'{"a":"\\uDC00\\uD800"}', LONE, "$.a", 64),
    (b'{"a":"\\uD800\\n"}', LONE, "$.a", 64),
    (b'{"a":"\\uD800 \\uDC00"}', LONE, "$.a", 64),
    (b'{"a":"\\uD800', LONE, "$.a", 64),  # the end of input comes after
    (b'{"a":"\\uD800\\uDC', LONE, "$.a", 64),
    (b'{"a":"\\uD800\\uZZZZ"}', LONE, "$.a", 64),  # invalid hex after a high surrogate
    (b'{"a":"\\uD800\\x"}', LONE, "$.a", 64),
    (b'{"a":["x","\\uDBFF"]}', LONE, "$.a[1]", 64),
    (b'{"we ird":{"b":"\\uDBFF"}}', LONE, '$["we ird"].b', 64),
    (b'{"\\uD800":1}', KEY_LONE, "$", 64),
    (b'{"\\uD800\\u0041":1}', KEY_LONE, "$", 64),
    (b'{"b":{"\\uDFFF":1}}', KEY_LONE, "$.b", 64),
    (b'{"b":[0,{"x\\uDC00', KEY_LONE, "$.b[1]", 64),
    # UTF-8 inside strings: the error is at the sequence's lead byte
    (b'{"a":"\xc0\x80"}', J(6, UTF8), "$", 64),  # overlong
    (b'{"a":"\xc1\xbf"}', J(6, UTF8), "$", 64),  # overlong
    (b'{"a":"\xe0\x80\x80"}', J(6, UTF8), "$", 64),  # overlong
    (b'{"a":"\xe0\x9f\xbf"}', J(6, UTF8), "$", 64),  # overlong
    (b'{"a":"\xf0\x8f\xbf\xbf"}', J(6, UTF8), "$", 64),  # overlong
    (b'{"a":"\xed\xa0\x80"}', J(6, UTF8), "$", 64),  # U+D800 encoded directly
    (b'{"a":"\xed\xbf\xbf"}', J(6, UTF8), "$", 64),  # U+DFFF encoded directly
    (b'{"a":"\xf4\x90\x80\x80"}', J(6, UTF8), "$", 64),  # above U+10FFFF
    (b'{"a":"\xf5\x80\x80\x80"}', J(6, UTF8), "$", 64),
    (b'{"a":"\xf8\x88\x80\x80\x80"}', J(6, UTF8), "$", 64),
    (b'{"a":"\xff"}', J(6, UTF8), "$", 64),
    (b'{"a":"x\x80"}', J(7, UTF8), "$", 64),  # a lone continuation byte
    (b'{"a":"\xc3\xa9\xa9"}', J(8, UTF8), "$", 64),
    (b'{"a":"\xe2\x82', J(6, UTF8), "$", 64),  # cut short by the end of input
    (b'{"a":"\xe2', J(6, UTF8), "$", 64),
    (b'{"a":"\xe2\x82A"}', J(6, UTF8), "$", 64),  # cut short by ASCII
    (b'{"a":"\xe2\x82"}', J(6, UTF8), "$", 64),
    (b'{"a":"\xf0\x9f\x98"}', J(6, UTF8), "$", 64),
    (b'{"a":"\xf0\x9f\x98\xc3\xa9"}', J(6, UTF8), "$", 64),
    (b'{"\xff":1}', J(2, UTF8), "$", 64),
    # duplicate keys: the path of the second one, found before its ':'
    (b'{"a":1,"a":2}', DUP, "$.a", 64),
    (b'{"a":1,"a"', DUP, "$.a", 64),
    (b'{"a":1,"a"x', DUP, "$.a", 64),
    (b'{"a":1,"b":2,"a":{"c":', DUP, "$.a", 64),
    (b'{"x":{"b":1,"b":2}}', DUP, "$.x.b", 64),
    (b'{"x":[{"b":1},{"b":2,"b":3}]}', DUP, "$.x[1].b", 64),
    (b'{"x":[[{"b":1,"b":3}]]}', DUP, "$.x[0][0].b", 64),
    (b'{"\\u0061":1,"a":2}', DUP, "$.a", 64),  # keys compare decoded
    (b'{"\\uD83D\\uDE00":1,"\xf0\x9f\x98\x80":2}', DUP, '$["😀"]', 64),
    (b'{"we.ird":1,"we.ird":2}', DUP, '$["we.ird"]', 64),
    (b'{"":1,"":2}', DUP, '$[""]', 64),
    # depth: the root object is level 1
    (b"{}", "nesting deeper than 0 levels", "$", 0),
    (b"{", "nesting deeper than 0 levels", "$", 0),
    (b'{"a":{}}', "nesting deeper than 1 levels", "$.a", 1),
    (b'{"a":[]}', "nesting deeper than 1 levels", "$.a", 1),
    (b'{"a":[[1]]}', "nesting deeper than 2 levels", "$.a[0]", 2),
    (b'{"a":[1,[', "nesting deeper than 2 levels", "$.a[1]", 2),  # before the end of input
    (b'{"a":{"b":{"c":{}}}}', "nesting deeper than 3 levels", "$.a.b.c", 3),
    (b'{"a":[{"b":[]}]}', "nesting deeper than 3 levels", "$.a[0].b", 3),
    (b'{"a":[{"b":{"c":1}}]}', "nesting deeper than 3 levels", "$.a[0].b", 3),
]


@pytest.mark.parametrize("raw,message,path,max_depth", HOSTILE,
                         ids=[f"{i}:{r[:40].decode('latin-1')}" for i, (r, *_) in enumerate(HOSTILE)])
def test_hostile_documents(raw, message, path, max_depth):
    with pytest.raises(SchemaError) as e:
        parse_document(raw, max_depth=max_depth)
    assert (e.value.message, e.value.path) == (message, path)


def test_hostile_table_is_big_enough():
    assert len(HOSTILE) >= 60


@pytest.mark.parametrize("raw,max_depth", [
    (b'{"a":{"b":{}}}', 3),
    (b'{"a":[[1]]}', 3),
    (b'{"a":[[1],{"b":2}]}', 3),
    (b'{}', 1),
    (b'{"a":1}', 1),
    (b'{"a":[]}', 2),
])
def test_depth_exactly_the_limit(raw, max_depth):
    doc = parse_document(raw, max_depth=max_depth)
    assert doc == json.loads(raw) and _depth(doc) == max_depth


TRUNCATED = b'{"a": [1, -2.5e3, true, false, null, "x\\u00e9\\ud83d\\ude00\xc3\xa9", [], {}], "b": {"c": 0}} '


def test_every_truncation_raises():
    assert parse_document(TRUNCATED) == json.loads(TRUNCATED)
    for cut in range(len(TRUNCATED.rstrip())):
        with pytest.raises(SchemaError) as e:
            parse_document(TRUNCATED[:cut])
        message = e.value.message
        if message.startswith("invalid JSON at byte "):
            pos = int(message.split()[4].rstrip(":"))
            assert pos <= cut
            if message.endswith(EOF):
                assert pos == cut
        elif message == LONE:  # cut after the high half of the escaped pair, before its end
            k = TRUNCATED.index(b"\\ud83d")
            assert k + 6 <= cut < k + 12
        else:
            assert message == "empty document" and cut == 0


UTF8_EDGES = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
              0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8, 0xFF]


@given(st.binary(min_size=1, max_size=5)
       | st.lists(st.sampled_from(UTF8_EDGES), min_size=1, max_size=5).map(bytes))
@_settings(200)
def test_utf8_rules_are_the_codecs(b):
    """A string's bytes are accepted exactly when Python's strict UTF-8 codec accepts them, and
    the error is at the start of the sequence the codec first rejects."""
    b = bytes(c for c in b if c >= 0x20 and c not in b'"\\')
    raw = b'{"a":"' + b + b'"}'
    try:
        expected = b.decode("utf-8")
    except UnicodeDecodeError as err:
        with pytest.raises(SchemaError) as e:
            parse_document(raw)
        assert e.value.message == J(6 + err.start, UTF8)
    else:
        assert parse_document(raw) == {"a": expected}


def _error(raw: bytes, max_depth: int = 64) -> tuple[str, str]:
    with pytest.raises(SchemaError) as e:
        parse_document(raw, max_depth=max_depth)
    return e.value.message, e.value.path


def _unexpected(b: int) -> str:
    return f"unexpected character '{chr(b)}'" if 0x21 <= b <= 0x7E else f"unexpected byte 0x{b:02x}"


def test_every_byte_between_tokens():
    for b in range(256):
        raw = b"{" + bytes([b]) + b"}"
        if b in b" \t\n\r":
            assert parse_document(raw) == {}
        elif b == ord('"'):
            assert _error(raw) == (J(3, EOF), "$")
        elif b == ord("}"):
            assert _error(raw) == (J(2, "unexpected content after the document"), "$")
        else:
            assert _error(raw) == (J(1, KEY), "$")


def test_every_byte_at_a_value_position():
    for b in range(256):
        raw = b'{"a":' + bytes([b]) + b"}"
        c = chr(b)
        if c.isdigit() and b < 0x80:
            assert _same(parse_document(raw), {"a": int(c)})
        elif c in "NI":
            assert _error(raw) == (J(5, NAN), "$")
        elif c == "-":
            assert _error(raw) == (J(6, NUM), "$")
        elif c in '"{':
            assert _error(raw) == (J(7, EOF), "$")
        elif c in "[ \t\n\r":
            assert _error(raw) == (J(6, "unexpected character '}'"), "$")
        else:  # t, f and n included: not their literal
            assert _error(raw) == (J(5, _unexpected(b)), "$")


def test_every_byte_after_a_backslash():
    for b in range(256):
        raw = b'{"a":"\\' + bytes([b]) + b'0041"}'
        if b == ord("u"):
            assert parse_document(raw) == {"a": "A"}
        elif b in b'"\\/bfnrt':
            assert parse_document(raw) == json.loads(raw)
        else:
            assert _error(raw) == (J(6, "invalid escape"), "$")


def test_every_byte_in_a_string():
    for b in range(256):
        raw = b'{"a":"x' + bytes([b]) + b'"}'
        if b < 0x20:
            assert _error(raw) == (J(7, CTRL), "$")
        elif b >= 0x80:
            assert _error(raw) == (J(7, UTF8), "$")
        elif b == ord('"'):
            assert _error(raw) == (J(8, OBJ_NEXT), "$")
        elif b == ord("\\"):
            assert _error(raw) == (J(10, EOF), "$")
        else:
            assert parse_document(raw) == {"a": "x" + chr(b)}


def test_utf8_sequences_exhaustively():
    """Every lead byte with every second byte, then with boundary bytes after: accepted
    exactly when the strict codec accepts, the error at the sequence the codec rejects."""
    cases = [bytes([lead, second, 0x80, 0x80]) for lead in range(0x80, 0x100) for second in range(256)]
    cases += [bytes([lead, second]) + tail for lead in range(0x80, 0x100) for second in UTF8_EDGES
              for tail in (b"", b"\x80", b"\xbf\x7f", b"\x80\xbf", b"\x8f\x90\x41")]
    for b in cases:
        raw = b'{"a":"' + b + b'"}'
        try:
            expected = b.decode("utf-8")
        except UnicodeDecodeError as err:
            assert _error(raw) == (J(6 + err.start, UTF8), "$"), b
        else:
            assert parse_document(raw) == {"a": expected}, b


# ---------------------------------------------------------------- mutations


class _Rejected(ValueError):
    pass


def _reject(x):
    raise _Rejected(x)


def _pairs(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Rejected("duplicate key")
    return d


def _strict_loads(raw: bytes):
    """json.loads without its extensions: NaN/Infinity, duplicate keys, invalid UTF-8."""
    return json.loads(raw.decode("utf-8"), parse_constant=_reject, object_pairs_hook=_pairs)


def _leaves(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
        yield from v  # keys too
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def _has_lone_surrogate(v) -> bool:
    return any(isinstance(x, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in x) for x in _leaves(v))


MUTATION_BYTES = st.sampled_from(list(b' \t\n\r\x0b\x0c{}[]",:\\/\'-+.0123456789eEtfnulasrvxUINdD'
                                     b"\x00\x1f\x7f\x80\xa0\xbf\xc3\xe2\xed\xf0\xff"))
MUTATION = st.tuples(st.sampled_from(["insert", "delete", "replace"]), st.integers(0, 10**6),
                     MUTATION_BYTES | st.integers(0, 255))
SOURCES = st.one_of(
    DOCS.map(lambda d: json.dumps(d).encode()),
    DOCS.map(lambda d: json.dumps(d, ensure_ascii=False, indent=1).encode()),
    DOCS.map(orjson.dumps),
    st.sampled_from([TRUNCATED, b'{"a":"\\uD83D\\uDE00","b":[1e5,-0,0.5],"c":{"d":[[]]}}',
                     b'{"k":9223372036854775807,"m":-9223372036854775808,"x":1e308}']),
)


def mutate(source: bytes, mutations) -> bytes:
    """``source`` after ``mutations`` (tuples of MUTATION) in turn."""
    raw = bytearray(source)
    for op, at, byte in mutations:
        if op == "insert":
            raw.insert(at % (len(raw) + 1), byte)
        elif raw and op == "delete":
            del raw[at % len(raw)]
        elif raw:
            raw[at % len(raw)] = byte
    return bytes(raw)


@given(SOURCES, st.lists(MUTATION, min_size=1, max_size=3))
@_settings(300)
def test_mutations_are_strict(source, mutations):
    raw = mutate(source, mutations)
    max_depth = 6
    try:
        got = parse_document(raw, max_depth=max_depth)
    except SchemaError as e:
        got = e
    try:
        expected = _strict_loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, _Rejected
        expected = e
    if not isinstance(got, SchemaError):
        assert not isinstance(expected, Exception), raw
        assert _same(got, expected), raw
        for lst in _lists(got):
            assert _same(_strict_loads(lst.json.encode()), lst)
        # and the rules json.loads lacks held
        assert _depth(got) <= max_depth and not _has_lone_surrogate(got)
        assert all(keys.INT_MIN <= x <= keys.INT_MAX for x in _leaves(got) if type(x) is int)
        assert all(math.isfinite(x) for x in _leaves(got) if type(x) is float)
    elif not isinstance(expected, Exception):
        # json.loads accepted it: only the rules it lacks may reject it
        m = got.message
        if m.startswith("a document must be a JSON object"):
            assert not isinstance(expected, dict)
        elif m.endswith("(lone surrogate)"):
            assert _has_lone_surrogate(expected)
        elif m == RANGE:
            assert any(type(x) is int and not keys.INT_MIN <= x <= keys.INT_MAX for x in _leaves(expected))
        elif m.startswith("non-finite number"):
            assert any(type(x) is float and math.isinf(x) for x in _leaves(expected))
        elif m.startswith("nesting deeper than"):
            assert _depth(expected) > max_depth
        else:
            pytest.fail(f"{raw!r}: json.loads accepts it, parse_document says {got}")
