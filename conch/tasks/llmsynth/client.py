"""A minimal OpenAI-compatible chat client over plain HTTP (urllib: conch depends on no HTTP library).

Why not the `openai` package: it is not a dependency, and the two endpoints used here (GET /models,
POST /chat/completions) are the whole contract every server shares (vLLM, llama.cpp, hosted APIs). The URL is
the user's (`--llm`), never a built-in host; the key comes from the environment variable the user names.

`chat` retries transient failures (connection errors, 408/409/425/429/5xx) with exponential backoff and
jitter; other HTTP errors are the request's fault and raise `ChatError` at once.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ChatError(RuntimeError):
    """The endpoint did not answer usably (after retries where that could help)."""


class Unreachable(ChatError):
    """Nothing answers at the URL (connection refused, DNS, timeout)."""


def base_url(url: str) -> str:
    """`http://host:8000` or `http://host:8000/v1` -> `http://host:8000/v1` (the OpenAI API root)."""
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class ChatClient:
    url: str
    model: str
    api_key: str | None = None
    timeout: float = 600.0
    retries: int = 4
    backoff: float = 1.0  # seconds before the first retry; doubled each time
    temperature: float = 0.7
    max_tokens: int = 4096

    def __post_init__(self) -> None:
        self.url = base_url(self.url)

    def _request(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300].strip()
            raise HTTPStatus(exc.code, f"HTTP {exc.code} from {self.url}{path}: {detail or exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach {self.url}{path}: {reason}") from None
        except ValueError as exc:
            raise ChatError(f"{self.url}{path} did not answer JSON: {exc}") from None

    def models(self, timeout: float = 10.0) -> list[str] | None:
        """The served model names (GET /models), or None when the server has no such endpoint."""
        try:
            doc = self._request("GET", "/models", None, timeout)
        except HTTPStatus as exc:
            if exc.status in (401, 403):
                raise
            return None
        data = doc.get("data") if isinstance(doc, dict) else None
        return [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else None

    def chat(self, messages: list[dict]) -> str:
        """The assistant's text for `messages`; retries transient errors, raises ChatError otherwise."""
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        for attempt in range(self.retries + 1):
            try:
                doc = self._request("POST", "/chat/completions", body, self.timeout)
                return _content(doc)
            except (Unreachable, HTTPStatus) as exc:
                transient = isinstance(exc, Unreachable) or exc.status in RETRY_STATUS
                if not transient or attempt == self.retries:
                    raise
                time.sleep(self.backoff * (2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")


class HTTPStatus(ChatError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _content(doc: dict) -> str:
    try:
        content = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ChatError(f"no choices[0].message.content in the answer: {json.dumps(doc)[:200]}") from None
    return content if isinstance(content, str) else ""
