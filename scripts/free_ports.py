#!/usr/bin/env python3
"""Prints N distinct free TCP ports on 127.0.0.1, one per line (N defaults to 1).

The ports come from below the kernel's ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range): a port the kernel handed out for a bind to
port 0 and that was then closed is free only until the next outgoing connection takes
it, which is how the test control plane's etcd once found its port taken. A port below
the range is never given to a connection; each one printed was bound once here to
check that nothing listens on it.
"""
import random
import socket
import sys


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_ports(n: int, exclude=()) -> list:
    """N distinct free ports below the ephemeral range, none of them in `exclude` (ports
    handed out before and perhaps not bound yet)."""
    low, high = 20000, ephemeral_low()
    if high - low < 1000:
        low = 10000
    candidates = [p for p in random.sample(range(low, high), high - low) if p not in exclude]
    ports = [p for p in candidates[: 50 * n + 100] if bindable(p)][:n]
    if len(ports) < n:
        raise RuntimeError(f"free_ports: found {len(ports)} free ports of {n} in {low}-{high - 1}")
    return ports


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("\n".join(map(str, free_ports(n))))


if __name__ == "__main__":
    main()
