from __future__ import annotations

import json

import pytest

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.handlers import formatters as fmt
from lmforge.handlers import openai_formatters as ofmt


def events() -> list[GenerationEvent]:
    return [
        GenerationEvent(Token(5, "he", -0.5), 3, 1),
        GenerationEvent(Token(6, "llo", -1.25), 3, 2),
        GenerationEvent(Token(2, "", -0.1, special=True), 3, 3, finish_reason=FinishReason.EOS),
    ]


def test_lmi_json_with_details() -> None:
    f = fmt.LmiFormatter("p", details=True, return_full_text=False)
    evs = events()
    for e in evs:
        f.add(e)
    out = f.final_json(evs[-1])
    assert out == {
        "generated_text": "hello",
        "details": {
            "finish_reason": "eos_token",
            "generated_tokens": 3,
            "inputs": "p",
            "prompt_tokens": 3,
            "tokens": [
                {"id": 5, "text": "he", "log_prob": -0.5},
                {"id": 6, "text": "llo", "log_prob": -1.25},
                {"id": 2, "text": "", "log_prob": -0.1, "special_token": True},
            ],
        },
    }


def test_lmi_jsonlines_lines() -> None:
    f = fmt.LmiFormatter("p", details=True, return_full_text=True)
    lines = [json.loads(fmt.frame(f.stream_line(e), fmt.JSONLINES)) for e in events()]
    assert lines[0] == {
        "token": {"id": 5, "text": "he", "log_prob": -0.5},
        "generated_text": None,
        "details": None,
    }
    assert lines[-1]["generated_text"] == "phello"
    assert lines[-1]["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": 3,
        "inputs": "p",
        "prompt_tokens": 3,
    }


def test_sse_framing_and_error_line() -> None:
    f = fmt.LmiFormatter("p", details=False, return_full_text=False)
    f.stream_line(events()[0])
    err = GenerationEvent(None, 3, 1, finish_reason=FinishReason.ERROR, error="boom", error_status=503)
    raw = fmt.frame(f.stream_line(err), fmt.SSE)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    line = json.loads(raw[6:])
    assert line["error"] == "boom" and line["code"] == 503
    assert line["details"]["finish_reason"] == "error"
    assert line["generated_text"] == "he"


def test_nan_log_prob_is_null_not_invalid_json() -> None:
    line = fmt.token_dict(Token(1, "x", float("nan")))
    assert line["log_prob"] is None
    fmt.dumps(line)


def test_chat_json_and_chunks() -> None:
    c = ofmt.ChatFormatter("m", logprobs=True)
    out = c.final_json(events())
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["logprobs"]["content"][1]["logprob"] == -1.25
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    s = ofmt.ChatFormatter("m", logprobs=False)
    chunks = [s.chunk(e) for e in events()]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "he"}
    assert chunks[1]["choices"][0]["delta"] == {"content": "llo"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "usage" not in chunks[-1]  # only when stream_options.include_usage asks, in a chunk of its own
    asked = ofmt.ChatFormatter("m", logprobs=False, include_usage=True)
    for e in events():
        asked.chunk(e)
    usage = json.loads(asked.trailer(fmt.SSE).split(b"\n\n")[0][len(b"data: ") :])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert all(ch["id"] == chunks[0]["id"] for ch in chunks)


TEXTS = ["x", " hello", 'quo"te', "back\\slash", "new\nline\t\r", "\x00\x1f", "ünïcødé 字 🙂", "", "\u2028"]


@pytest.mark.parametrize("media", [fmt.JSONLINES, fmt.SSE])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_openai_chunk_template_is_byte_identical_to_the_encoded_dict(media: str, kind: str) -> None:
    def make() -> ofmt.ChatFormatter | ofmt.CompletionFormatter:
        f: ofmt.ChatFormatter | ofmt.CompletionFormatter = ofmt.CompletionFormatter("m", logprobs=False)
        if kind == "chat":
            f = ofmt.ChatFormatter('m"odel', logprobs=False)
        f.index, f.id, f.created = 2, "chatcmpl-x", 1700000000
        return f

    fast, slow = make(), make()
    for n, text in enumerate(TEXTS, start=1):
        event = GenerationEvent(Token(n, text, -0.5), 3, n)
        assert fast.stream_frame(event, media) == fmt.frame(slow.chunk(event), media), text
    last = GenerationEvent(Token(9, "end", -0.5), 3, 99, finish_reason=FinishReason.LENGTH)
    assert fast.stream_frame(last, media) == fmt.frame(slow.chunk(last), media)
    assert fast.trailer(media) == slow.trailer(media)


def test_openai_finish_reasons_are_openais_and_failures_are_error_events() -> None:
    """One table: every finish reason maps to an OpenAI value or to none (an error, an abort), and a
    stream that ends without an answer sends its last token, then OpenAI's error object, then only
    [DONE] (no usage chunk, no "error" finish reason)."""
    assert set(ofmt.OPENAI_FINISH_REASON) == set(FinishReason)
    assert set(ofmt.OPENAI_FINISH_REASON.values()) <= {"stop", "length", "tool_calls", "content_filter", None}
    cases = [
        (
            GenerationEvent(Token(7, "x", -0.5), 3, 2, FinishReason.ERROR, "boom", 424),
            424,
            "InternalServerError",
        ),
        (GenerationEvent(None, 3, 1, FinishReason.ABORT), 503, "ServiceUnavailableError"),
    ]
    for final, status, kind in cases:
        for make in (ofmt.ChatFormatter, ofmt.CompletionFormatter):
            f = make("m", logprobs=False, include_usage=True)
            first = f.stream_frame(GenerationEvent(Token(5, "he", -0.5), 3, 1), fmt.SSE)
            raw = f.stream_frame(final, fmt.SSE) + f.trailer(fmt.SSE)
            data = [json.loads(e[6:]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
            assert raw.endswith(b"data: [DONE]\n\n") and first.startswith(b"data: ")
            *chunks, error = data
            assert error == {
                "error": {"message": error["error"]["message"], "type": kind, "param": None, "code": status}
            }
            assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * len(chunks)
            assert len(chunks) == (final.token is not None)  # the failing event's own token is sent


def test_token_text_names_sentencepiece_byte_fallback_tokens_by_their_bytes() -> None:
    """SentencePiece-style tokenizers (Llama): ``▁`` is a space and ``<0xNN>`` one byte."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from lmforge.handlers.logprobs import TokenText

    vocab = {"<unk>": 0, "<s>": 1, "\u2581hello": 2, "<0xF0>": 3, "<0x9F>": 4, "\u00e9": 5}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")
    text = TokenText(tok)
    assert [text.raw(i) for i in (2, 3, 4, 5)] == [b" hello", b"\xf0", b"\x9f", "\u00e9".encode()]
    assert [text.name(i) for i in (1, 2, 3, 5)] == ["<s>", " hello", "bytes:\\xf0", "\u00e9"]
    entry = text.chat_entry(Token(3, "", -1.0, top_logprobs=[(4, -2.0), (2, -3.0)]))
    assert entry["bytes"] == [0xF0] and [t["bytes"] for t in entry["top_logprobs"]] == [
        [0x9F],
        list(b" hello"),
    ]
    # LMI's top_tokens give an alternative's text as the token decoded alone (U+FFFD for a lone byte)
    lmi = fmt.LmiFormatter("p", details=False, return_full_text=False, token_text=text)
    line = lmi.stream_line(
        GenerationEvent(Token(2, " hello", -1.0, top_logprobs=[(3, -2.0), (2, -3.0)]), 1, 1)
    )
    assert line["top_tokens"] == [
        {"id": 3, "text": tok.decode([3]), "log_prob": -2.0},
        {"id": 2, "text": tok.decode([2]), "log_prob": -3.0},
    ]
