"""Owner names (one prefix per process, a counter per acquisition) and run info encoded once."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from celery_fence import codec
from celery_fence.errors import NotSerializable
from celery_fence.lease import OwnerNames


def test_names_are_for_people_and_unique_per_acquisition() -> None:
    names = OwnerNames()
    seen = [names() for _ in range(1000)]
    assert len(set(seen)) == 1000
    assert all(n.startswith(f"{socket.gethostname()}:{os.getpid()}:") for n in seen)


def test_two_runtimes_in_one_process_never_collide() -> None:
    assert len({OwnerNames()() for _ in range(100)}) == 100


def test_threads_never_share_a_name() -> None:
    names, seen, lock = OwnerNames(), [], threading.Lock()

    def take() -> None:
        mine = [names() for _ in range(500)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 4000


def test_a_forked_child_makes_a_prefix_of_its_own() -> None:
    names = OwnerNames()
    parent = names()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first name and leave at once
        os.write(write, names().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode()
    os.waitpid(pid, 0)
    assert child.split(":")[1] == str(pid)
    assert child.rsplit("-", 1)[0] != parent.rsplit("-", 1)[0]


def test_an_encoded_mapping_is_encoded_once_and_read_as_a_mapping() -> None:
    run = codec.Encoded({"task": "t", "args": [1]})
    assert dict(run) == {"task": "t", "args": [1]} and len(run) == 2 and run["task"] == "t"
    assert codec.dumps_mapping(run) is run.text == codec.dumps({"task": "t", "args": [1]})
    assert codec.dumps_mapping({"a": 1}) == '{"a":1}'
    assert codec.dumps_mapping(None) is None


def test_an_unencodable_mapping_fails_at_construction() -> None:
    with pytest.raises(NotSerializable):
        codec.Encoded({"f": object()})
