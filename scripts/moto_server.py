"""moto's DynamoDB emulator for the tests, with two changes.

- Requests run one at a time, behind one lock: moto evaluates a condition and
  writes without a lock of its own, so racing conditional writes could both
  win, which real DynamoDB never allows.
- Every request is counted under each table it names, and
  GET /__idem/requests?table=NAME answers {"requests": N}: the tests count
  round trips per operation on tables of their own.

Usage: python moto_server.py [--host 127.0.0.1] [--port 8000]
"""

import argparse
import io
import json
import threading
from collections import Counter
from urllib.parse import parse_qs

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def tables_named(body: bytes) -> set:
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return set()
    if not isinstance(request, dict):
        return set()
    names = set()
    if isinstance(request.get("TableName"), str):
        names.add(request["TableName"])
    for item in request.get("TransactItems", []):
        for action in item.values():
            if isinstance(action, dict) and isinstance(action.get("TableName"), str):
                names.add(action["TableName"])
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()

    moto = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()
    counts: Counter = Counter()

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/__idem/requests":
            table = parse_qs(environ.get("QUERY_STRING", "")).get("table", [""])[0]
            with lock:
                body = json.dumps({"requests": counts[table]}).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        with lock:
            for table in tables_named(body):
                counts[table] += 1
            result = moto(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                if hasattr(result, "close"):
                    result.close()

    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
