"""moto's S3 server in a child process: `python -m oncelog.testing._s3_child PORT`.

The test fixtures start it so the server's request handling never waits for the test's
own threads to release the interpreter lock (in-process, every request of a test paid
that hand-over). It prints `ready` once it accepts connections, and stops when its stdin
closes: when the parent stops it, or dies (a SIGKILLed test run leaves no server behind).
"""

from __future__ import annotations

import logging
import sys


def main() -> None:
    from moto.server import ThreadedMotoServer

    from oncelog.testing.fixtures import make_object_writes_atomic

    port = int(sys.argv[1])
    make_object_writes_atomic()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes the pipe, or dies
    finally:
        server.stop()


if __name__ == "__main__":
    main()
