"""A client for the adapters API of a running lmforge (or LMI) server.

Two spellings of one API: SageMaker's (``POST /adapters``, ``GET /adapters``, ``PUT``/``DELETE
/adapters/NAME``) and LMI's (``/models/MODEL/adapters``), chosen by ``model``. Used by ``lmforge
adapter --url`` and by the local SageMaker, which registers adapter inference components with
their base component's container the way SageMaker does.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

DEFAULT_TIMEOUT_S = 300.0  # registering may load the adapter (preload) before answering


class AdaptersApiError(Exception):
    """A refusal (non-200) or a server that cannot be reached (``status`` None)."""

    def __init__(self, message: str, status: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@dataclass
class AdaptersClient:
    url: str
    """``http://HOST:PORT`` (a path prefix is kept)."""
    model: str | None = None
    """With a model name, LMI's ``/models/MODEL/adapters`` form."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url if "://" in self.url else f"http://{self.url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{self.url!r} is not an http(s)://HOST:PORT URL")
        self._parts = parts

    @property
    def prefix(self) -> str:
        return f"/models/{quote(self.model, safe='')}/adapters" if self.model else "/adapters"

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One JSON call: (status, decoded answer); AdaptersApiError only when unreachable."""
        parts = self._parts
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.hostname or "", parts.port, timeout=self.timeout_s)
        full = parts.path.rstrip("/") + path
        try:
            data = None if body is None else json.dumps(body).encode()
            sent = {**self.headers, **(headers or {}), "Content-Type": "application/json"}
            conn.request(method, full, body=data, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            raise AdaptersApiError(f"cannot reach {self.url}: {exc}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"message": raw.decode("utf-8", errors="replace").strip()[:500]}
        if not isinstance(answer, dict):
            answer = {"message": str(answer)}
        if response.status != 200 and not answer.get("message"):
            answer["message"] = response.reason
        return response.status, answer

    def _ok(self, method: str, path: str, body: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        status, answer = self.request(method, path, body, **kw)
        if status != 200:
            field_name = answer.get("param")
            where = f" [{field_name}]" if field_name else ""
            raise AdaptersApiError(
                f"{method} {path}: {status} {answer.get('message')}{where}", status, field_name
            )
        return answer

    def _path(self, name: str) -> str:
        return f"{self.prefix}/{quote(name, safe='')}"

    def register(
        self, name: str, src: str, headers: dict[str, str] | None = None, **options: Any
    ) -> dict[str, Any]:
        return self._ok("POST", self.prefix, {"name": name, "src": src, **options}, headers=headers)

    def update(
        self, name: str, src: str, headers: dict[str, str] | None = None, **options: Any
    ) -> dict[str, Any]:
        return self._ok("PUT", self._path(name), {"src": src, **options}, headers=headers)

    def remove(self, name: str) -> dict[str, Any]:
        return self._ok("DELETE", self._path(name))

    def describe(self, name: str) -> dict[str, Any]:
        return self._ok("GET", self._path(name))

    def list(self) -> list[dict[str, Any]]:
        """Every registered adapter (all pages)."""
        adapters: list[dict[str, Any]] = []
        token: str | None = "0"
        while token is not None:
            query = urlencode({"limit": 1000, "next_page_token": token})
            page = self._ok("GET", f"{self.prefix}?{query}")
            adapters += page.get("adapters", [])
            token = page.get("nextPageToken")
        return adapters
