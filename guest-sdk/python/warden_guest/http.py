"""Outbound HTTP for Python plugins: a small blocking client over
`wasi:http/outgoing-handler`, the only network a Warden plugin can have
(Python's `socket` and `urllib` cannot work: the sandbox offers no sockets).

The host checks every request against the hosts the operator granted the
plugin (scheme, host, port), resolves the name itself and refuses addresses
that are not public unless the operator granted that address; a refused
request raises `HttpError` with `denied` set, naming the host. A plugin
granted no host gets a denial for every request. Redirects are not
followed: send a new request to the `location` header, which the host
checks like any other.

    from warden_guest import http

    response = http.fetch("https://api.example.com/v1/items",
                          headers={"accept": "application/json"})
    if response.status == 200:
        items = response.json()

The bindings exist only inside the component: natively `fetch` raises
`HttpError` (test the code around it with a stand-in).
"""

import json as _json
from urllib.parse import urlsplit

# Imported now, not in `fetch`: componentize-py bundles the modules imported
# while the app is initialised, and a module first imported later is missing.
try:
    from componentize_py_types import Err, Ok
    from wit_world.imports import outgoing_handler
    from wit_world.imports import wasi_http_types as h
except ImportError:  # natively: no bindings, no network
    outgoing_handler = h = None

# Most response body bytes read by default; the rest is dropped and
# `Response.truncated` is set.
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20

_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 4096


class HttpError(Exception):
    """A request that failed: `denied` when the sandbox refused it (a host
    not granted, an address not public, the lease's request limit)."""

    def __init__(self, message, host="", denied=False):
        super().__init__(message)
        self.message = message
        self.host = host
        self.denied = denied


class Response:
    """A response: `status`, `headers` (list of (name, value)), `body`
    (bytes, at most the request's `max_response_bytes`), `truncated`."""

    def __init__(self, status, headers, body, truncated):
        self.status = status
        self.headers = headers
        self.body = body
        self.truncated = truncated

    def header(self, name):
        """The first value of header `name` (any case), or None."""
        name = name.lower()
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None

    def text(self):
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        return _json.loads(self.body)


def fetch(url, method="GET", headers=None, body=b"", max_response_bytes=DEFAULT_MAX_RESPONSE_BYTES):
    """Sends one request and reads the response. `headers` is a dict or a
    list of (name, value); `body` bytes or str. Raises HttpError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"`{url}` is not an absolute http or https URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"{parts.hostname}:{port}"
    if outgoing_handler is None:
        raise HttpError(
            "outbound HTTP exists only inside the component (natively, use a stand-in)", host
        )

    if isinstance(body, str):
        body = body.encode("utf-8")
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    entries = [(n.lower(), v.encode("utf-8") if isinstance(v, str) else v) for n, v in pairs]
    if body and not any(n == "content-length" for n, _ in entries):
        entries.append(("content-length", str(len(body)).encode()))
    try:
        fields = h.Fields.from_list(entries)
    except Err as e:
        raise HttpError(f"invalid headers ({type(e.value).__name__})", host) from None
    request = h.OutgoingRequest(fields)
    try:
        request.set_method(_method(method.upper()))
        request.set_scheme(h.Scheme_Https() if parts.scheme == "https" else h.Scheme_Http())
        request.set_authority(parts.netloc.rsplit("@", 1)[-1])
        path = parts.path or "/"
        request.set_path_with_query(path + ("?" + parts.query if parts.query else ""))
    except Err:
        raise HttpError(f"the host refused the request to `{url}`", host) from None
    outgoing = request.body()
    try:
        future = outgoing_handler.handle(request, None)
    except Err as e:
        raise _from_code(e.value, host) from None
    with future:
        if body:
            with outgoing.write() as stream:
                for i in range(0, len(body), _WRITE_CHUNK):
                    try:
                        stream.blocking_write_and_flush(body[i : i + _WRITE_CHUNK])
                    except Err:
                        break
        try:
            h.OutgoingBody.finish(outgoing, None)
        except Err as e:
            raise _from_code(e.value, host) from None
        with future.subscribe() as pollable:
            pollable.block()
        got = future.get()
        if not isinstance(got, Ok) or not isinstance(got.value, Ok):
            code = got.value.value if isinstance(got, Ok) else None
            if code is None:
                raise HttpError("the response was already taken", host)
            raise _from_code(code, host)
        with got.value.value as response:
            status = response.status()
            with response.headers() as fields:
                got_headers = [(n, v.decode("utf-8", "replace")) for n, v in fields.entries()]
            with response.consume() as incoming:
                content, truncated = _read(incoming, max_response_bytes, host)
    return Response(status, got_headers, content, truncated)


def _read(incoming, limit, host):
    out = bytearray()
    with incoming.stream() as stream:
        while True:
            want = min(limit + 1 - len(out), _READ_CHUNK)
            try:
                out += stream.blocking_read(want)
            except Err as e:
                if type(e.value).__name__ == "StreamError_Closed":
                    return bytes(out), False
                raise HttpError(f"reading the response from `{host}` failed", host) from None
            if len(out) > limit:
                return bytes(out[:limit]), True


def _method(name):
    known = {
        "GET": h.Method_Get, "HEAD": h.Method_Head, "POST": h.Method_Post, "PUT": h.Method_Put,
        "DELETE": h.Method_Delete, "CONNECT": h.Method_Connect, "OPTIONS": h.Method_Options,
        "TRACE": h.Method_Trace, "PATCH": h.Method_Patch,
    }
    return known[name]() if name in known else h.Method_Other(name)


def _from_code(code, host):
    if isinstance(code, h.ErrorCode_HttpRequestDenied):
        return HttpError(
            f"request to `{host}` denied: not among the hosts granted to this plugin", host, True
        )
    if isinstance(code, h.ErrorCode_DestinationIpProhibited):
        return HttpError(
            f"request to `{host}` denied: it resolves to an address that is not public "
            "and not granted",
            host,
            True,
        )
    if isinstance(code, h.ErrorCode_ConnectionLimitReached):
        return HttpError(
            f"request to `{host}` denied: the lease's request limit is reached", host, True
        )
    return HttpError(f"request to `{host}` failed: {type(code).__name__.removeprefix('ErrorCode_')}", host)
