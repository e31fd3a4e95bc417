"""A producer process of the failover test: appends `count` messages `<name>-<i>` to a channel
through the nodes given, a window of requests in flight, printing `acked <payload>` for each
acknowledged one (and `done` at the end)."""

from __future__ import annotations

import sys
from collections import deque

from oncelog.streaming import StreamingError, connect


def main() -> None:
    addresses, channel, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = connect(addresses, retry_timeout=60)
    window: deque = deque()

    def settle(item: tuple[str, object]) -> None:
        payload, future = item
        try:
            future.result()  # type: ignore[attr-defined]
        except StreamingError as exc:
            print(f"failed {payload} {exc}", flush=True)
            return
        print(f"acked {payload}", flush=True)

    for i in range(count):
        payload = f"{name}-{i}"
        window.append((payload, client.append_async(channel, [payload], vchannel=name)))
        if len(window) >= 16:
            settle(window.popleft())
    while window:
        settle(window.popleft())
    client.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
