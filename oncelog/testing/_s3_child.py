"""moto's S3 server in a child process: `python -m oncelog.testing._s3_child PORT`.

The test fixtures start it so the server's request handling never waits for the test's
own threads to release the interpreter lock (in-process, every request of a test paid
that hand-over). It prints `ready` once it accepts connections, and stops when its stdin
closes: when the parent stops it, or dies (a SIGKILLed test run leaves no server behind).
"""

from __future__ import annotations

import sys


def main() -> None:
    from oncelog.testing.fixtures import moto_in_process

    server = moto_in_process(int(sys.argv[1]))
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes the pipe, or dies
    finally:
        server.stop()


if __name__ == "__main__":
    main()
