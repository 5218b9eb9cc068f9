"""`rlk.use_backends` scopes under generators and threads, fuzzed as random programs.

A program mixes the caller entering and leaving scopes, generators entering a scope of their
own, yielding inside it and leaving it, threads entering scopes while the caller runs, and
copied contexts. After every step each party must see the innermost scope it entered
itself (a suspended generator's scope is invisible to its caller; a new thread starts
from the environment's policy). "nested" keeps at most one generator inside its scope at
a time; "interleaved" suspends several inside their scopes and lets them leave in any
order."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Generator

import pytest
from fuzzing import fuzz, tally
from hypothesis import strategies as st

import rlk
from rlk.dispatch import captured_policy

NAMES = ("native", "cuda", "testbackend", "faraway")
THREADS_INHERIT = bool(getattr(sys.flags, "thread_inherit_context", False))


def _view() -> tuple[str, ...] | None:
    policy = captured_policy()
    return None if policy is None else tuple(policy.order)


def _scoped(name: str) -> Generator[tuple[str, ...] | None, str | None, None]:
    """Yields what it sees inside its own scope until sent "exit", then what it sees after."""
    with rlk.use_backends(name):
        while (yield _view()) != "exit":
            pass
    yield _view()


def _in_a_thread(name: str, caller: tuple[str, ...] | None) -> None:
    """A thread sees the environment's policy (or its creator's, where threads inherit the
    context), its own scope inside it, and leaves the caller's view alone."""
    seen: list[object] = []
    inside, release = threading.Event(), threading.Event()

    def run() -> None:
        seen.append(_view())
        with rlk.use_backends(name):
            seen.append(_view())
            inside.set()
            release.wait(10)
        seen.append(_view())

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(10), "the thread did not enter its scope"
    assert _view() == caller, "the thread's scope leaked to the caller"
    release.set()
    thread.join(10)
    start = caller if THREADS_INHERIT else None
    assert seen == [start, (name,), start], seen


@pytest.mark.parametrize("regime", ["nested", "interleaved"])
@fuzz(data=st.data(), steps=st.integers(1, 25))
def test_scopes_hold_where_they_were_entered(regime, data, steps):
    tally("use_backends scopes")
    with contextlib.ExitStack() as outer:
        caller: list[contextlib.ExitStack] = []
        names: list[str] = []
        inside: dict[int, tuple[str, Generator]] = {}  # generator number -> (name, generator)
        for number in range(steps):
            top = tuple(names[-1:]) or None
            moves = ["generator", "thread", "copy"]
            if not inside:
                moves += ["enter", "enter"] + (["exit"] if caller else [])
            if inside:
                moves += ["step", "leave"]
            if inside and regime == "nested":
                moves.remove("generator")
            move = data.draw(st.sampled_from(moves))
            if move == "enter":
                name = data.draw(st.sampled_from(NAMES))
                scope = outer.enter_context(contextlib.ExitStack())
                scope.enter_context(rlk.use_backends(name))
                caller.append(scope)
                names.append(name)
            elif move == "exit":
                caller.pop().close()
                names.pop()
            elif move == "generator":
                name = data.draw(st.sampled_from(NAMES))
                generator = _scoped(name)
                outer.callback(generator.close)  # whatever fails, no scope outlives the test
                assert next(generator) == (name,), "a generator's own scope inside it"
                inside[number] = (name, generator)
            elif move == "step":
                key = data.draw(st.sampled_from(sorted(inside)))
                name, generator = inside[key]
                assert next(generator) == (name,), f"generator {key} resumed in its scope"
            elif move == "leave":
                key = data.draw(st.sampled_from(sorted(inside)))
                name, generator = inside.pop(key)
                assert generator.send("exit") == top, f"generator {key} after its scope"
            elif move == "thread":
                _in_a_thread(data.draw(st.sampled_from(NAMES)), top)
            else:
                assert contextvars.copy_context().run(_view) == top, "a copied context"
            assert _view() == (tuple(names[-1:]) or None), f"the caller after {move}"
