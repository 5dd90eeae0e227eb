"""A real gRPC server (grpcio) for the tests, with raw-bytes methods (no generated code).

Run as ``python tests/grpcpeer.py --port 0 [--name NAME]``; it prints
``listening on 127.0.0.1:PORT`` and serves until killed:

- ``/test.Echo/Unary``: the request back; initial metadata ``x-origin: NAME``, trailing
  metadata ``x-trail: <the request's x-meta>``.
- ``/test.Echo/Stream``: request ``b"N,MS"``: N messages ``b"i"``, one every MS milliseconds.
- ``/test.Echo/Bidi``: each request message back as it comes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from concurrent import futures

import grpc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--name", default="peer")
    args = ap.parse_args()
    name = args.name

    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        meta = dict(context.invocation_metadata())
        context.send_initial_metadata((("x-origin", name),))
        context.set_trailing_metadata((("x-trail", str(meta.get("x-meta", ""))),))
        return request

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        n, ms = (int(x) for x in request.split(b","))
        context.send_initial_metadata((("x-origin", name),))
        for i in range(n):
            if not context.is_active():
                return
            yield b"%d" % i
            time.sleep(ms / 1000)

    def bidi(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    handler = grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64),
                         options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
