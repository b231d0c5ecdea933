"""The malformed requests of `flashdesk serve`, sent to the HTTP server of the real worker (StartServer
on the loaded demo pair, as the app's server panel starts it). Each must get a 4xx with OpenAI's
error object saying what is wrong, and the server and the worker must keep answering; at the end
a well-formed request must still be served.
"""

from __future__ import annotations

import importlib.util
import json

from flashdesk import protocol as p
from .inputs import CONTEXT, Case, Lab

USER = [{"role": "user", "content": "hi"}]
# (name, body: raw bytes or a JSON value, status, a phrase the error message must hold)
MALFORMED = [
    ("serve_body_not_json", b"{not json", 400, "not valid JSON"),
    ("serve_body_not_an_object", b"[1, 2, 3]", 400, "must be a JSON object"),
    ("serve_body_not_utf8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "not valid JSON"),
    ("serve_unknown_model", {"messages": USER, "model": "gpt-4o"}, 404, "does not exist"),
    ("serve_max_tokens_over_context", {"messages": USER, "max_tokens": 10**9}, 400, "whole context"),
    ("serve_messages_empty", {"messages": []}, 400, "messages is empty"),
    ("serve_messages_missing", {}, 400, "messages is required"),
    ("serve_messages_not_a_list", {"messages": "hello"}, 400, "messages"),
    ("serve_unknown_role", {"messages": [{"role": "tool", "content": "x"}]}, 400, "role"),
    ("serve_content_not_text", {"messages": [{"role": "user", "content": 42}]}, 400, "content must be a string"),
    (
        "serve_image_content",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "text only",
    ),
    (
        "serve_last_message_not_user",
        {"messages": USER + [{"role": "assistant", "content": "ok"}]},
        400,
        "the last message must be from the user",
    ),
    ("serve_temperature_out_of_range", {"messages": USER, "temperature": -0.5}, 400, "temperature"),
    ("serve_temperature_not_a_number", {"messages": USER, "temperature": "hot"}, 400, "temperature"),
    ("serve_several_choices", {"messages": USER, "n": 3}, 400, "only n=1"),
    ("serve_stop_not_text", {"messages": USER, "stop": 7}, 400, "stop must be"),
    (
        "serve_prompt_over_context",
        {"messages": [{"role": "user", "content": "tell me a story " * 600}], "max_tokens": CONTEXT // 2},
        400,
        "context",
    ),
]


def serve_available() -> bool:
    """Whether this checkout has `flashdesk serve` (engine/serve/)."""
    try:
        return importlib.util.find_spec("flashdesk.engine.serve.app") is not None
    except ImportError:
        return False


def _server(lab: Lab) -> str:
    """The worker's HTTP server on the loaded demo pair (started once); its URL."""
    lab.load_demo()
    if lab.server_url is None:
        w = lab.worker()
        w.send(p.StartServer("127.0.0.1", 0))
        state = w.until(p.ServerState)[-1]
        if not state.running:
            raise RuntimeError(f"the server did not start: {state.error}")
        lab.server_url = state.url
    return lab.server_url


def _request(lab: Lab, body, status: int, phrase: str) -> str | None:
    import httpx

    base = _server(lab)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
        try:
            error = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"{r.status_code} without OpenAI's error object: {r.text[:200]}"
        if r.status_code != status or phrase.lower() not in str(error.get("message", "")).lower():
            return f"{r.status_code}: {error.get('message')!r} (expected {status} saying {phrase!r})"
        if http.get("/health").status_code != 200:
            return "the server stopped answering /health"
    return None


def _still_serves(lab: Lab) -> str | None:
    import httpx

    with httpx.Client(base_url=_server(lab), timeout=60) as http:
        r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4})
    if r.status_code != 200:
        return f"{r.status_code}: {r.text[:200]}"
    return None if r.json()["usage"]["completion_tokens"] >= 1 else "an empty reply"


def serve_cases(lab: Lab) -> list[Case]:
    cases = [
        Case(name, f"{status}: {phrase!r}", lambda b=body, s=status, ph=phrase: _request(lab, b, s, ph), engine=True)
        for name, body, status, phrase in MALFORMED
    ]
    return cases + [
        Case(
            "serve_well_formed_after_all",
            "200: a reply, after every malformed request",
            lambda: _still_serves(lab),
            engine=True,
        )
    ]
