"""documents: generated ids (drawn from a pool of OS randomness)."""

from __future__ import annotations

import os
import re
import threading

from rtindex import documents


def test_generated_ids_are_distinct_hex_across_pool_refills():
    ids = [documents.new_id() for _ in range(3 * documents._IdPool._IDS + 7)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_threads_never_get_the_same_id():
    got: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(documents.new_id() for _ in range(5000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in got for i in out]
    assert len(set(every)) == len(every) == 20000


def test_a_forked_child_does_not_repeat_its_parents_ids():
    documents.new_id()  # the pool holds ids the child must not hand out again
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave at once
        try:
            os.write(w, "".join(documents.new_id() for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = f.read().decode()
    os.waitpid(pid, 0)
    parent = [documents.new_id() for _ in range(8)]
    child_ids = [child[i : i + 32] for i in range(0, len(child), 32)]
    assert len(child_ids) == 8 and not set(child_ids) & set(parent)
