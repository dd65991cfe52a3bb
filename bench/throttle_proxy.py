"""A rate-limited TCP relay in front of the local registry: what a node's link is to its registry.

    python bench/throttle_proxy.py --listen 127.0.0.1:5055 --upstream 127.0.0.1:5000 --rate 1Gbit

Every byte the registry sends (the downloads of a pull) passes one shared schedule of ``rate``
bytes/s, whatever the number of connections: the engine fetches layers three at a time, and a node's
link is one link. Uploads pass unthrottled. A relay of bytes, not an HTTP proxy: the engine speaks
to it as to the registry itself (127.0.0.0/8 is plain http to the engine), so a `docker login` to
the relay's address carries the registry's basic auth through.

Used by bench/bench_cold_start.py (in process, ``Relay``); runnable alone for a manual try.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from buildkit_py.recipe.model import parse_bandwidth  # noqa: E402

CHUNK = 256 << 10


class Schedule:
    """One virtual clock for the whole link: a chunk of n bytes may leave at the later of now and
    the moment the previous chunk finished leaving, and takes n / rate seconds."""

    def __init__(self, rate: float):
        self.rate = rate
        self.next = 0.0
        self.sent = 0

    def delay(self, n: int) -> float:
        now = time.monotonic()
        start = max(now, self.next)
        self.next = start + n / self.rate
        self.sent += n
        return start - now


class Relay:
    """The relay on ``listen`` (host, port; port 0: any free one) to ``upstream``, in a thread of its own."""

    def __init__(self, upstream: tuple[str, int], rate: float, listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.upstream, self.listen, self.schedule = upstream, listen, Schedule(rate)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop)
        self._thread.join(10)

    def _stop(self) -> None:
        # the engine keeps its connections open: end their relays before the loop stops
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.call_soon(self.loop.stop)

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, *self.listen))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(asyncio.CancelledError):  # the relay stopping with the connection open
            await asyncio.gather(self._pipe(reader, up_writer, throttled=False),
                                 self._pipe(up_reader, writer, throttled=True))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, throttled: bool) -> None:
        try:
            while data := await reader.read(CHUNK):
                if throttled:
                    wait = self.schedule.delay(len(data))
                    if wait > 0:
                        await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:5055")
    parser.add_argument("--upstream", default="127.0.0.1:5000")
    parser.add_argument("--rate", default="1Gbit", help="1Gbit, 500Mbit, 100MB/s")
    args = parser.parse_args()
    rate = parse_bandwidth(args.rate)
    if not rate:
        parser.error(f"--rate {args.rate}: not a rate like 1Gbit or 100MB/s")
    with Relay(_host_port(args.upstream), rate, _host_port(args.listen)) as relay:
        print(f"relaying {relay.address} -> {args.upstream} at {rate * 8 / 1e6:.0f} Mbit/s; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
