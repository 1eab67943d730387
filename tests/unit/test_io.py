from __future__ import annotations

import json

from lmforge.handlers.io import Input, Output


def test_input_accessors() -> None:
    inp = Input({"content-type": "application/json", "X-Custom": "1"}, {"data": b'{"a": 1}'})
    assert inp.get_property("Content-Type") == "application/json"
    assert inp.get_property("X-Custom") == "1"
    assert inp.get_as_json() == {"a": 1}
    assert inp.get_data() == {"a": 1}
    assert inp.get_as_string() == '{"a": 1}'
    assert not inp.is_empty()
    assert inp.get_batches() == [inp]
    assert Input({"x": "y"}).is_empty()


def test_output_builders() -> None:
    out = Output().add_as_json({"x": 1})
    assert out.properties["Content-Type"] == "application/json"
    assert json.loads(out.body()) == {"x": 1}
    err = Output().error("bad thing", code=400)
    assert err.code == 400 and json.loads(err.body())["error"] == "bad thing"
    assert Output().add("a").add(b"b").body() == b"ab"
