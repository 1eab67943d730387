from __future__ import annotations

from lmforge.errors import (
    ERROR_TABLE,
    BadRequestError,
    LmforgeError,
    OverloadedError,
    classify,
    error_for_status,
)


def test_table_statuses() -> None:
    assert {k: v.status for k, v in ERROR_TABLE.items()} == {
        "bad_request": 400,
        "not_found": 404,
        "method_not_allowed": 405,
        "conflict": 409,
        "payload_too_large": 413,
        "unsupported_media_type": 415,
        "model_error": 424,
        "overloaded": 503,
        "not_ready": 503,
        "engine_dead": 503,
        "out_of_memory": 507,
    }


def test_every_error_class_has_a_table_entry() -> None:
    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in [s, *subclasses(s)]]

    for cls in subclasses(LmforgeError):
        assert cls.kind in ERROR_TABLE, cls


def test_to_dict_names_param() -> None:
    err = BadRequestError("bad", param="parameters.top_p")
    assert err.to_dict() == {
        "code": 400,
        "type": "bad_request",
        "message": "bad",
        "param": "parameters.top_p",
    }
    assert OverloadedError("full", retry_after=1).retry_after == 1


def test_classify_oom_and_other() -> None:
    assert classify(MemoryError("x")).status == 507
    assert classify(RuntimeError("CUDA error: out of memory")).status == 507
    err = classify(ValueError("broken at 0x7f00deadbeef\nline2"))
    assert err.status == 424
    assert "0x7f00deadbeef" not in err.message and "line2" not in err.message
    assert err.message.startswith("ValueError: broken")


def test_error_for_status() -> None:
    assert error_for_status(400, "x").status == 400
    assert error_for_status(503, "x").status == 503
    assert error_for_status(None, "x").status == 424


def test_docs_errors_is_generated_from_the_table() -> None:
    from pathlib import Path

    from lmforge.errors import ERROR_TABLE, render_errors_markdown

    text = render_errors_markdown()
    doc = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
    assert doc.read_text(encoding="utf-8") == text, "run: python -m lmforge.errors"
    for entry in ERROR_TABLE.values():
        assert f"| {entry.status} | `{entry.type}` |" in text
