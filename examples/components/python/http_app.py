"""A TensorWasm HTTP handler in Python: a small JSON API as a wasi:http/incoming-handler
component (world wasi:http/proxy). docs/components.md shows how to build it.

Routes:
  GET  /hello            text greeting
  GET  /items/{n}        {"id": n, "method": ..., "query": ...}
  POST /sum              {"numbers": [...]} -> {"sum": ...}; 400 on bad JSON
  ANY  /echo             the request body back, streamed as it arrives, same content-type
  GET  /headers          the request's x-* headers as JSON
  GET  /stream?n=K       K lines written one after another
  GET  /fail             answers with a wasi:http error code instead of a response
  GET  /boom, /spin, /hog?mib=N   hostile: an exception, an endless loop, a memory hog
  GET  /clog             hostile: writes to a response body nobody reads (the response is
                         never set) until its deadline
  GET  /flush            hostile: fills such a body, then blocking-flush on it
  POST /splice           hostile: splices its request body into such a body
  GET  /pollwrite        hostile: fills such a body, then polls its never-ready pollable
  GET  /hoard?bytes=N    hostile: keeps making header fields with an N-byte value (default
                         60000) until the host refuses them (they count against its memory)
  GET  /sleep?s=N        sleeps N seconds (wasi:io/poll), then answers
  GET  /fetch?url=U      GETs U through wasi:http/outgoing-handler: {"status", "body"}, or
                         {"error": the wasi:http error code} (the server allows only the
                         origins of --outgoing-http-allow)
  anything else          404 {"error": "not found"}
"""

import json
import time
from urllib.parse import parse_qs, urlsplit

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import outgoing_handler, poll, streams
from wit_world.imports.types import (
    ErrorCode_InternalError,
    Fields,
    IncomingRequest,
    Method_Get,
    Method_Post,
    OutgoingBody,
    OutgoingRequest,
    OutgoingResponse,
    ResponseOutparam,
    Scheme_Http,
    Scheme_Https,
)

# wasi:io allows at most 4096 bytes per blocking-write-and-flush.
WRITE_CHUNK = 4096


def method_name(method) -> str:
    if isinstance(method, Method_Get):
        return "GET"
    if isinstance(method, Method_Post):
        return "POST"
    name = type(method).__name__.removeprefix("Method_")
    return method.value if name == "Other" else name.upper()


def start(response_out: ResponseOutparam, status: int, content_type: str):
    """Sets the response's head; returns its body and the body's stream."""
    response = OutgoingResponse(Fields.from_list([("content-type", content_type.encode())]))
    response.set_status_code(status)
    body = response.body()
    ResponseOutparam.set(response_out, Ok(response))
    return body, body.write()


def finish(body: OutgoingBody, stream: streams.OutputStream) -> None:
    stream.__exit__(None, None, None)
    OutgoingBody.finish(body, None)


def write_all(stream: streams.OutputStream, data: bytes) -> None:
    for at in range(0, len(data), WRITE_CHUNK):
        stream.blocking_write_and_flush(data[at : at + WRITE_CHUNK])


def respond(response_out, status: int, value, content_type="application/json") -> None:
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    body, stream = start(response_out, status, content_type)
    write_all(stream, data)
    finish(body, stream)


def read_all(message) -> bytes:
    """The whole body of an incoming request or response."""
    incoming = message.consume()
    stream = incoming.stream()
    chunks = []
    while True:
        try:
            chunks.append(stream.blocking_read(65536))
        except Err as e:
            if isinstance(e.value, streams.StreamError_Closed):
                break
            raise
    stream.__exit__(None, None, None)
    incoming.__exit__(None, None, None)
    return b"".join(chunks)


def error_name(code) -> str:
    return type(code).__name__.removeprefix("ErrorCode_")


def fetch(url: str) -> dict:
    """GETs `url` through wasi:http/outgoing-handler."""
    parts = urlsplit(url)
    request = OutgoingRequest(Fields())
    request.set_scheme(Scheme_Https() if parts.scheme == "https" else Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query(parts.path or "/")
    try:
        future = outgoing_handler.handle(request, None)
    except Err as e:
        return {"error": error_name(e.value)}
    pollable = future.subscribe()
    while (answer := future.get()) is None:
        pollable.block()
    pollable.__exit__(None, None, None)
    future.__exit__(None, None, None)
    if isinstance(answer, Err):
        return {"error": "response taken twice"}
    if isinstance(answer.value, Err):
        return {"error": error_name(answer.value.value)}
    response = answer.value.value
    status = response.status()
    body = read_all(response)  # an incoming-response is consumed like a request
    response.__exit__(None, None, None)
    return {"status": status, "body": body.decode()}


def clog(shape: str, request: IncomingRequest) -> None:
    """Hostile shapes that wait in the host, never in Python code: each writes to the body of
    a response it never sets, which nobody reads, and waits for room in it."""
    response = OutgoingResponse(Fields())
    body = response.body()
    stream = body.write()
    if shape == "/clog":
        while True:
            stream.blocking_write_and_flush(b"x" * WRITE_CHUNK)
    if shape == "/splice":
        incoming = request.consume()
        source = incoming.stream()
        while True:
            stream.blocking_splice(source, WRITE_CHUNK)
    # Fill the body as far as it takes without waiting.
    while True:
        room = stream.check_write()
        if room == 0:
            break
        stream.write(b"x" * min(room, WRITE_CHUNK))
    if shape == "/flush":
        stream.blocking_flush()
    else:
        poll.poll([stream.subscribe()])
    raise RuntimeError(f"{shape} returned")


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        url = urlsplit(request.path_with_query() or "/")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        method = method_name(request.method())
        headers = request.headers().entries()
        path = url.path

        if path == "/hello":
            respond(response_out, 200, b"hello from Python\n", "text/plain")
        elif path.startswith("/items/"):
            item = path.removeprefix("/items/")
            if not item.isdigit():
                respond(response_out, 400, {"error": "an item id is a number"})
            else:
                respond(response_out, 200, {"id": int(item), "method": method, "query": query})
        elif path == "/sum" and method == "POST":
            try:
                numbers = json.loads(read_all(request))["numbers"]
                respond(response_out, 200, {"sum": sum(numbers)})
            except (ValueError, KeyError, TypeError) as e:
                respond(response_out, 400, {"error": f"bad request: {e}"})
        elif path == "/echo":
            content_type = next(
                (v.decode() for k, v in headers if k.lower() == "content-type"),
                "application/octet-stream",
            )
            incoming = request.consume()
            source = incoming.stream()
            body, sink = start(response_out, 200, content_type)
            while True:
                try:
                    write_all(sink, source.blocking_read(65536))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise
            source.__exit__(None, None, None)
            incoming.__exit__(None, None, None)
            finish(body, sink)
        elif path == "/headers":
            seen = {k.lower(): v.decode() for k, v in headers if k.lower().startswith("x-")}
            respond(response_out, 200, seen)
        elif path == "/stream":
            body, stream = start(response_out, 200, "text/plain")
            for i in range(int(query.get("n", "3"))):
                write_all(stream, f"line {i}\n".encode())
            finish(body, stream)
        elif path == "/fail":
            ResponseOutparam.set(response_out, Err(ErrorCode_InternalError("failing on purpose")))
        elif path == "/boom":
            raise RuntimeError("boom, on purpose")
        elif path == "/spin":
            while True:
                pass
        elif path in ("/clog", "/flush", "/splice", "/pollwrite"):
            clog(path, request)
        elif path == "/hoard":
            value = b"v" * int(query.get("bytes", "60000"))
            kept = []
            while True:
                kept.append(Fields.from_list([("x-hoard", value)]))
        elif path == "/sleep":
            seconds = float(query.get("s", "60"))
            time.sleep(seconds)
            respond(response_out, 200, {"slept": seconds})
        elif path == "/fetch":
            respond(response_out, 200, fetch(query.get("url", "")))
        elif path == "/hog":
            held = bytearray(int(query.get("mib", "64")) << 20)
            respond(response_out, 200, {"held": len(held)})
        else:
            respond(response_out, 404, {"error": "not found", "path": path})
