"""The transport's floor for the HTTP benchmarks: an ASGI app that reads the request's body and answers a fixed V2
response, served the way ``fnserve serve``'s front processes are (``fnserve.server.fronts``: uvicorn, uvloop and
httptools, a socket of its own a process); uvicorn's own httptools protocol, or with ``fnserve`` fnserve's
(``fnserve.adapters.http.protocol``: a response's head and body in one write). ``ANSWER``: a file whose bytes
are the answer instead (another model's, as fnserve answers it).

    python -m tests.bench.echo_server PORT PROCESSES [fnserve [ANSWER]]
"""

from __future__ import annotations

import sys
from typing import Any

ANSWER = (
    b'{"model_name":"digits-accurate","model_version":"1","outputs":[{"name":"label","datatype":"INT64",'
    b'"shape":[1],"data":[7]},{"name":"probabilities","datatype":"FP32","shape":[1,10],'
    b'"data":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,1.0,0.0,0.0]}]}'
)
ANSWER_ENV = "ECHO_ANSWER"  # how the front processes (spawned: they import this module afresh) learn the answer


def echo(answer: bytes) -> Any:
    """The ASGI app that reads a request's whole body, as any server must, and answers ``answer``."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


def factory() -> Any:
    import os

    path = os.environ.get(ANSWER_ENV)
    if path is None:
        return echo(ANSWER)
    with open(path, "rb") as file:
        return echo(file.read())


if __name__ == "__main__":
    import os

    from fnserve.server import fronts

    if len(sys.argv) > 4:
        os.environ[ANSWER_ENV] = sys.argv[4]
    protocol = "fnserve.adapters.http.protocol:HttpProtocol" if sys.argv[3:4] == ["fnserve"] else "httptools"
    options = {"host": "127.0.0.1", "port": int(sys.argv[1]), "loop": "uvloop", "http": protocol}
    fronts.run(
        "tests.bench.echo_server:factory", int(sys.argv[2]), {**options, "access_log": False, "log_level": "warning"}
    )
