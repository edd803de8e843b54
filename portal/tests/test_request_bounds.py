"""The request body bound (``portal.request_bounds``) on the real ASGI application: a body past it is answered 413
with a clear message before it is read, whether or not it declares its length, on the API, forms and admin."""

from __future__ import annotations

import asyncio
import json

import pytest

from ops.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

CHUNK = 64 * 1024


async def call(
    path: str,
    *,
    body_chunks: int,
    declare_length: bool,
    content_type: bytes = b"application/json",
    chunk: bytes = b" " * CHUNK,
    method: str = "POST",
    extra_headers: tuple = (),
) -> tuple[int, bytes, int]:
    """Send ``body_chunks`` chunks to ``path``; the status, the body and how many chunks the portal read."""
    headers = [(b"host", b"testserver"), (b"content-type", content_type), *extra_headers]
    if declare_length:
        headers.append((b"content-length", str(body_chunks * len(chunk)).encode()))
    read = 0
    sent: list[dict] = []

    async def receive():
        nonlocal read
        if read < body_chunks:
            read += 1
            return {"type": "http.request", "body": chunk, "more_body": read < body_chunks}
        await asyncio.Event().wait()  # the client stays connected until the answer comes

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await application(scope, receive, send)
    start = next(message for message in sent if message["type"] == "http.response.start")
    body = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return start["status"], body, read


@pytest.mark.parametrize("path", ["/api/v1/auth/token/", "/api/v1/attempts/", "/accounts/login/", "/admin/login/"])
async def test_a_body_declared_past_the_bound_is_refused_before_any_of_it_is_read(path, settings):
    settings.REQUEST_BODY_MAX_BYTES = 4 * CHUNK
    status, body, read = await call(path, body_chunks=200, declare_length=True)
    assert status == 413
    assert read == 0
    if path.startswith("/api/"):
        assert json.loads(body)["error"] == {
            "code": "request_too_large",
            "message": f"The request is too large: at most {4 * CHUNK} bytes may be sent.",
        }
    else:
        assert b"The request is too large" in body


async def test_a_chunked_body_is_refused_once_it_passes_the_bound(settings):
    settings.REQUEST_BODY_MAX_BYTES = 4 * CHUNK
    status, body, read = await call("/api/v1/auth/token/", body_chunks=200, declare_length=False)
    assert status == 413
    assert read == 5  # the chunk that went past the bound, and none after it
    assert json.loads(body)["error"]["code"] == "request_too_large"


async def test_a_body_within_the_bound_reaches_the_view(settings):
    settings.REQUEST_BODY_MAX_BYTES = 4 * CHUNK
    status, body, _read = await call("/api/v1/auth/token/", body_chunks=1, declare_length=True, chunk=b"{}")
    assert status == 400  # the view's own answer: no username and password
    assert json.loads(body)["error"]["code"] != "request_too_large"


async def test_uploads_have_their_own_larger_bound(settings):
    settings.REQUEST_BODY_MAX_BYTES = 2 * CHUNK
    settings.REQUEST_UPLOAD_MAX_BYTES = 8 * CHUNK
    multipart = b"multipart/form-data; boundary=x"
    status, _body, _read = await call("/admin/login/", body_chunks=4, declare_length=True, content_type=multipart)
    assert status != 413
    status, _body, read = await call("/admin/login/", body_chunks=9, declare_length=True, content_type=multipart)
    assert (status, read) == (413, 0)


async def test_the_refusal_speaks_the_persons_language(settings):
    settings.REQUEST_BODY_MAX_BYTES = CHUNK
    _status, body, _read = await call(
        "/accounts/login/", body_chunks=2, declare_length=True, extra_headers=((b"accept-language", b"ja,en;q=0.5"),)
    )
    assert "リクエストが大きすぎます" in body.decode()
    _status, body, _read = await call(
        "/api/v1/me/",
        body_chunks=2,
        declare_length=True,
        extra_headers=((b"cookie", f"{settings.LANGUAGE_COOKIE_NAME}=ja".encode()),),
    )
    assert "リクエストが大きすぎます" in json.loads(body)["error"]["message"]
