"""Twenty sandboxes created and used at the same time."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

from e2b import Sandbox, SandboxQuery

from conftest import Berth

COUNT = 20


def test_twenty_sandboxes_used_concurrently(berth: Berth) -> None:
    tag = f"concurrent-{secrets.token_hex(4)}"

    def create(index: int) -> Sandbox:
        return Sandbox.create(timeout=600, metadata={"tag": tag, "index": str(index)})

    def use(pair: tuple[int, Sandbox]) -> tuple[str, str, str]:
        index, sandbox = pair
        sandbox.files.write(f"/home/user/own-{index}.txt", f"payload {index}")
        echoed = sandbox.commands.run(f"cat /home/user/own-{index}.txt; echo; ls /home/user | grep -c own-").stdout
        return sandbox.sandbox_id, echoed, sandbox.files.read(f"/home/user/own-{index}.txt")

    sandboxes: list[Sandbox] = []
    try:
        with ThreadPoolExecutor(max_workers=COUNT) as pool:
            sandboxes = list(pool.map(create, range(COUNT)))
            assert len({sandbox.sandbox_id for sandbox in sandboxes}) == COUNT
            results = list(pool.map(use, enumerate(sandboxes)))
        for index, (sandbox_id, echoed, read_back) in enumerate(results):
            # Each sandbox sees its own file and no other sandbox's.
            assert echoed == f"payload {index}\n1\n", (sandbox_id, echoed)
            assert read_back == f"payload {index}"

        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=100).next_items()
        assert {info.sandbox_id for info in listed} == {sandbox.sandbox_id for sandbox in sandboxes}

        with ThreadPoolExecutor(max_workers=COUNT) as pool:
            killed = list(pool.map(lambda sandbox: sandbox.kill(), sandboxes))
        assert all(killed)
        assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=100).next_items() == []
    finally:
        for sandbox in sandboxes:
            try:
                sandbox.kill()
            except Exception:  # already killed above
                pass
