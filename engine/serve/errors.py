"""What goes wrong in serving, said clearly: a server that cannot start (ServeError), and HTTP requests
answered with OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`.

Why every path goes through here: clients (the openai package, editors, agents) read that shape and
show its message; FastAPI's own 422 `detail` lists and Starlette's plain-text 500s are not read by
them, so the validation, HTTP and unexpected-exception handlers are all replaced.
"""

from __future__ import annotations

import logging
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flashdesk.engine.errors import FlashDeskError

log = logging.getLogger("flashdesk.serve")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ServeError(FlashDeskError):
    """The server cannot start as asked: an exposed address without a key, a busy port, no model."""


def error_body(message: str, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """A request answered with `status` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or (SERVER_ERROR if status >= 500 else INVALID_REQUEST)
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        return JSONResponse(self.body(), self.status, headers={**headers, **self.headers})


def _param(loc: tuple) -> str | None:
    """A pydantic location as a field path: ("body", "messages", 0, "role") -> "messages[0].role"."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def describe(errors: list[dict]) -> ApiError:
    """One clear sentence for the first problem pydantic found (and how many more there are)."""
    first = errors[0]
    kind, message = first.get("type", ""), first.get("msg", "").removeprefix("Value error, ")
    param = (first.get("ctx") or {}).get("param") or _param(tuple(first.get("loc", ())))
    if kind == "json_invalid":
        error = (first.get("ctx") or {}).get("error", "")
        text = f"the request body is not valid JSON: {error}".rstrip(": ")
        return ApiError(400, text, None, "invalid_json")
    if kind == "refused":
        text = message
    elif param is None and isinstance(first.get("input"), (bytes, str)):
        text = "the request body must be JSON, sent with the header Content-Type: application/json"
    elif param is None:
        text = "the request body must be a JSON object (the chat completion request)"
    elif kind == "missing":
        text = f"{param} is required"
    elif kind in ("literal_error", "enum"):
        text = f"{param}: {message}, got {first.get('input')!r}"
    else:
        text = f"{param}: {message}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return ApiError(400, text, param, "invalid_value")


def _unparsed(cause: BaseException | None) -> str:
    """Why FastAPI could not read a body as JSON, beyond a syntax error (which has its own answer)."""
    if isinstance(cause, RecursionError):
        return "the request body is nested too deeply: arrays and objects within each other, too many levels down"
    if isinstance(cause, UnicodeDecodeError):
        return "the request body is not valid JSON: it is not UTF-8 text"
    return f"the request body could not be read as JSON ({type(cause).__name__ if cause else 'unknown error'})"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return describe(list(exc.errors()) or [{"msg": "invalid request"}]).response()

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        text = {
            404: f"no such endpoint: {request.method} {request.url.path} (this server has GET /v1/models, "
            "POST /v1/chat/completions, POST /v1/completions, GET /health and GET /metrics)",
            405: f"{request.method} is not allowed on {request.url.path}",
            413: "the request body is too large",
        }.get(exc.status_code, str(exc.detail))
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # FastAPI's
            text = _unparsed(exc.__cause__)
        return JSONResponse(ApiError(exc.status_code, text).body(), exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed:\n%s", request.method, request.url.path, traceback.format_exc())
        return ApiError(500, f"internal server error ({type(exc).__name__}; the server's log has the rest)").response()
