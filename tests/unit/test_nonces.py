"""Nonces of registrations and claims: never the same twice, in a process or across a fork."""

from __future__ import annotations

import os

from workers.store.ledger_ops import nonce


def test_nonces_of_one_process_never_repeat() -> None:
    drawn = [nonce() for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn)


def test_a_forked_child_draws_other_nonces_than_its_parent() -> None:
    # Given a parent that drew nonces before and after a fork
    before = nonce()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first nonces, to the parent
        os.close(read)
        os.write(write, " ".join(nonce() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    parent_after = [nonce() for _ in range(3)]
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    # Then the child repeats none of them: the same counter from the same prefix would
    assert len(child) == 3
    assert not set(child) & {before, *parent_after}
    assert child[0][:12] != before[:12]
