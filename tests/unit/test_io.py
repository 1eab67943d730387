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


def test_djl_python_accessors_a_model_py_calls() -> None:
    """The rest of djl-python's Input/Output surface, as LMI's ``model.py`` handlers call it."""
    inp = Input({"content-type": "text/plain"}, {"data": b"hi"}, query={"adapter": "a1"})
    assert inp.get_properties() == {"content-type": "text/plain"}
    assert inp.contains_key("data") and inp.contains_key("adapter") and not inp.contains_key("other")
    assert inp.get_batch_size() == 1
    assert inp.get_content() == {"data": b"hi", "adapter": b"a1"}
    out = Output().set_code(201).set_message("Created")
    assert (out.code, out.message) == (201, "Created")


def test_output_builders() -> None:
    out = Output().add_as_json({"x": 1})
    assert out.properties["Content-Type"] == "application/json"
    assert json.loads(out.body()) == {"x": 1}
    err = Output().error("bad thing", code=400)
    assert err.code == 400 and json.loads(err.body())["error"] == "bad thing"
    assert Output().add("a").add(b"b").body() == b"ab"
