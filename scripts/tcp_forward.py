#!/usr/bin/env python3
"""Forwards every TCP connection to LISTEN on to TARGET, bytes unchanged, until SIGTERM.

    scripts/tcp_forward.py 10.213.4.1:443 127.0.0.1:6443

The test control plane (scripts/k8s-testenv.sh) serves its API server on 127.0.0.1 only;
pods on the real node reach it through this forwarder on the pod bridge's own address,
which is also the `kubernetes` Service's ClusterIP there. At most MAX_CONNECTIONS at once;
past that a connection is closed at once.
"""
import asyncio
import signal
import sys

MAX_CONNECTIONS = 512
CHUNK = 64 * 1024


def split(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


async def pipe(reader, writer):
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    listen, target = split(sys.argv[1]), split(sys.argv[2])
    open_now = 0

    async def handle(reader, writer):
        nonlocal open_now
        if open_now >= MAX_CONNECTIONS:
            writer.close()
            return
        open_now += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            open_now -= 1
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            open_now -= 1

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"tcp_forward: {sys.argv[1]} -> {sys.argv[2]}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
