"""Every error of the retrieval service in its own JSON format: ``{"error": reason}`` with the status.

aiohttp answers some errors itself, in plain text, before or around the service's handlers: an
unknown path (404) or method (405), a request it cannot parse (a bad request line, an oversized
header, a bad ``Content-Length``), a ``Content-Encoding`` it cannot decode (``br`` without Brotli:
"Can not decode content-encoding ..." with a traceback in the log), an ``Expect`` it does not
know (417), a handler's unexpected exception (500 "Server got itself in trouble"). A client of
the service (``HttpRetriever``, Search-R1's) reads ``error`` from JSON, so each of those is answered
here instead, with one log line and no traceback:

- ``json_errors`` (a middleware): HTTP errors raised by routing or a handler, any other exception
  (500, naming its type), and a request body in an encoding the service does not decode
  (``SUPPORTED_ENCODINGS``; 415, before the body is read);
- ``expect_handler``: an unknown ``Expect`` header (417);
- ``with_json_errors`` (for the connection factory): what aiohttp's connection handler answers
  itself, for requests it cannot parse or decode.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

# What aiohttp decodes without optional packages; anything else is refused with 415.
SUPPORTED_ENCODINGS = ("identity", "gzip", "deflate")
_LOG = logging.getLogger("aiohttp.server")
_REASON_CHARS = 300


def error_response(status: int, reason: str, headers: dict[str, str] | None = None, close: bool = False):
    """The service's error answer: ``{"error": reason}`` with ``status``."""
    from aiohttp import web

    response = web.Response(status=status, body=json.dumps({"error": reason}).encode(),
                            content_type="application/json", headers=headers)
    if close:
        response.force_close()
    return response


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_REASON_CHARS]


def unsupported_encoding(request: Any) -> str | None:
    """Why the body's ``Content-Encoding`` cannot be decoded, or None when it can."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding and encoding not in SUPPORTED_ENCODINGS:
        return (f"Content-Encoding {_one_line(encoding)!r} is not supported; send the body as "
                f"{', '.join(SUPPORTED_ENCODINGS)}")
    return None


def json_errors(counts: Any):
    """The middleware answering every error in JSON (module doc); ``counts``: the service's counters."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        if request.can_read_body and (reason := unsupported_encoding(request)):
            counts["bad_requests"] += 1
            return error_response(415, reason, close=True)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
            reason = exc.reason if exc.text in (None, f"{exc.status}: {exc.reason}") else exc.text
            return error_response(exc.status, f"{_one_line(reason)}: {request.method} {_one_line(request.path)}",
                                  headers)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in JSON, never crashes the service
            counts["server_errors"] += 1
            _LOG.error("internal error answering %s %s: %s: %s", request.method, _one_line(request.path),
                       type(exc).__name__, _one_line(str(exc)))
            return error_response(500, f"internal error: {type(exc).__name__}: {_one_line(str(exc))}", close=True)

    return middleware


async def expect_handler(request):
    """aiohttp's ``Expect: 100-continue`` handling, with an unknown expectation answered in JSON."""
    from aiohttp import web
    from aiohttp.web_urldispatcher import _default_expect_handler

    try:
        return await _default_expect_handler(request)
    except web.HTTPException as exc:
        return error_response(exc.status, f"unsupported Expect: {_one_line(request.headers.get('Expect', ''))}",
                              close=True)


def _parse_error_reason(status: int, exc: BaseException | None, message: str | None) -> tuple[int, str]:
    from aiohttp.http_exceptions import ContentEncodingError

    if isinstance(exc, ContentEncodingError):
        return 415, f"the body's Content-Encoding cannot be decoded; send it as {', '.join(SUPPORTED_ENCODINGS)}"
    detail = getattr(exc, "message", None) or message or str(exc or "")
    # aiohttp's messages end with the offending bytes over a caret line: keep the text and the bytes.
    lines = [line for line in str(detail).splitlines() if line.strip() and line.strip("^ ")]
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return status, _one_line(" ".join([f"{phrase}:", *lines[:2]]) if lines else phrase)


def with_json_errors(handler: Any) -> Any:
    """An aiohttp connection handler (``RequestHandler``) that answers what it cannot parse or
    decode in the service's JSON (``_JsonErrorHandler``)."""
    handler.__class__ = _json_error_handler_class()
    return handler


_HANDLER_CLASS: Any = None


def _json_error_handler_class() -> Any:
    # Built on first use: aiohttp is imported lazily (``memsearch --help`` stays instant).
    global _HANDLER_CLASS
    if _HANDLER_CLASS is None:
        from aiohttp.web_protocol import RequestHandler

        class _JsonErrorHandler(RequestHandler):
            """``RequestHandler`` whose own error answers are the service's JSON, and whose log
            records are one line each.
            Same slots as its base, so ``with_json_errors`` can set it as a handler's class."""

            __slots__ = ()

            def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                             message: str | None = None):
                if request.writer.output_size > 0:  # as aiohttp: an answer was begun, nothing to add
                    raise ConnectionError("Response is sent already, cannot send another response")
                status, reason = _parse_error_reason(status, exc, message)
                _LOG.warning("%d answered to %s: %s", status, request.remote, reason)
                return error_response(status, reason, close=True)

            def log_exception(self, message: str, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
                # One line, not a traceback: what a client sends must not fill the service's log
                # (e.g. the unreadable rest of a gzip body aiohttp reads after the answer).
                exc = exc_info if isinstance(exc_info, BaseException) else None
                cause = f": {type(exc).__name__}: {_one_line(str(exc))}" if exc is not None else ""
                _LOG.warning("%s%s", _one_line(message % args if args else message), cause)

        _HANDLER_CLASS = _JsonErrorHandler
    return _HANDLER_CLASS
