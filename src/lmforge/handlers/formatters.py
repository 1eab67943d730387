"""Response schemas: the one place that decides what lmforge sends back (LMI's here, OpenAI's in
:mod:`lmforge.handlers.openai_formatters`), and the framing both share.

* LMI ``json``: ``{"generated_text", "details"?}``; ``details`` = ``finish_reason``,
  ``generated_tokens``, ``inputs``, ``tokens[{id, text, log_prob}]`` (+ ``top_tokens``).
* LMI ``jsonlines`` (and ``sse``, the same objects as ``data:`` events): one line per token
  ``{"token": {...}, "generated_text": null, "details": null}``; the last line carries
  ``generated_text`` and, when asked, ``details`` without the token list.
* An error after an LMI stream has started is the stream's last line, in the same framing, with
  ``finish_reason: "error"``, the message and the status code it would have had.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.handlers.logprobs import TokenText, json_logprob

JSON = "application/json"
JSONLINES = "application/jsonlines"
SSE = "text/event-stream"

# One encoder for every line: json.dumps with non-default options builds a new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


def token_dict(token: Token) -> dict[str, Any]:
    out: dict[str, Any] = {"id": token.id, "text": token.text, "log_prob": json_logprob(token.log_prob)}
    if token.special:
        out["special_token"] = True
    return out


def _top_dicts(token: Token, token_text: TokenText) -> list[dict[str, Any]]:
    return [
        {"id": i, "text": token_text.decoded(i), "log_prob": json_logprob(lp)}
        for i, lp in token.top_logprobs or []
    ]


def frame(obj: Any, media_type: str) -> bytes:
    if media_type == SSE:
        return f"data: {dumps(obj)}\n\n".encode()
    return (dumps(obj) + "\n").encode()


class LmiFormatter:
    """Builds LMI responses from the events of one request."""

    def __init__(
        self, prompt: str, *, details: bool, return_full_text: bool, token_text: TokenText | None = None
    ) -> None:
        self.prompt = prompt
        self.token_text = token_text or TokenText(None)
        """Names ``top_tokens`` alternatives (None: a formatter used on its own leaves their text empty)."""
        self.details = details
        self.return_full_text = return_full_text
        self.tokens: list[Token] = []
        self.text_parts: list[str] = []

    def _details(self, event: GenerationEvent, *, with_tokens: bool) -> dict[str, Any]:
        d: dict[str, Any] = {
            "finish_reason": str(event.finish_reason),
            "generated_tokens": event.generated_tokens,
            "inputs": self.prompt,
            "prompt_tokens": event.prompt_tokens,
        }
        if with_tokens:
            d["tokens"] = [token_dict(t) for t in self.tokens]
            if any(t.top_logprobs for t in self.tokens):
                d["top_tokens"] = [_top_dicts(t, self.token_text) for t in self.tokens]
        return d

    def generated_text(self) -> str:
        text = "".join(self.text_parts)
        return self.prompt + text if self.return_full_text else text

    def add(self, event: GenerationEvent) -> None:
        if event.token is not None:
            self.tokens.append(event.token)
            self.text_parts.append(event.token.text)

    def final_json(self, event: GenerationEvent) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": self.generated_text()}
        if self.details:
            out["details"] = self._details(event, with_tokens=True)
        return out

    def stream_frame(self, event: GenerationEvent, media_type: str) -> bytes:
        """``frame(self.stream_line(event), media_type)``, byte for byte; a plain token line (the
        common case) is written from a template, 5-6x cheaper than building and encoding the dict."""
        token = event.token
        if (
            token is None
            or event.finished
            or token.special
            or token.top_logprobs
            or type(token.id) is not int
            or type(token.log_prob) is not float
        ):
            return frame(self.stream_line(event), media_type)
        self.tokens.append(token)
        self.text_parts.append(token.text)
        lp = json_logprob(token.log_prob)
        lp_text = "null" if lp is None else float.__repr__(lp)
        line = (
            f'{{"token":{{"id":{token.id},"text":{encode_basestring(token.text)},"log_prob":{lp_text}}},'
            '"generated_text":null,"details":null}'
        )
        return f"data: {line}\n\n".encode() if media_type == SSE else (line + "\n").encode()

    def stream_line(self, event: GenerationEvent) -> dict[str, Any]:
        self.add(event)
        line: dict[str, Any] = {
            "token": token_dict(event.token) if event.token is not None else None,
            "generated_text": None,
            "details": None,
        }
        if event.token is not None and event.token.top_logprobs:
            line["top_tokens"] = _top_dicts(event.token, self.token_text)
        if event.finished:
            line["generated_text"] = self.generated_text()
            if self.details or event.finish_reason == FinishReason.ERROR:
                line["details"] = self._details(event, with_tokens=False)
            if event.error is not None:
                line["error"] = event.error
                line["code"] = event.error_status
        return line
