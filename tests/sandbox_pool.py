"""The sandbox address pool for one `berth up` under test or benchmark: a /20 that no
host route or address uses (two daemons on one host need distinct pools; `berth up`
refuses a pool that overlaps the host's). Shared by every harness that starts one."""

from __future__ import annotations

import ipaddress
import random
import subprocess


def free_sandbox_pool(attempts: int = 200) -> str:
    words = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout.split()
    words += subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout.split()
    taken = []
    for word in words:
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.prefixlen > 0:
            taken.append(net)
    for _ in range(attempts):
        pool = ipaddress.ip_network(f"10.{random.randrange(128, 250)}.{random.randrange(0, 16) * 16}.0/20")
        if not any(pool.overlaps(net) for net in taken):
            return str(pool)
    raise RuntimeError("no free /20 for the sandbox pool")
