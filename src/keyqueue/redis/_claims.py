"""Claims: how ``run_workers`` and ``arun_workers`` take keys from a Redis queue in batches.

A worker process's threads (or tasks) share one ``Claims`` of their queue.
A worker that wants a key takes one the last claim brought, or, if none is
left and no claim is on its way, becomes the claimant and makes the next
claim itself: one ``claim`` script that sends the dones of every key the
workers finished since the last one (after ``forget`` for a handler that
succeeded) and takes as many keys as workers are waiting, each with its own
lease and fencing token. The others wait for it (client-go's workers wait in
``Get`` the same way). So a busy process sends about one script per batch
instead of three per key, and never claims more keys than it has free
workers.

The claimant, leaving with its key, wakes one waiter; a woken worker that
takes a key wakes the next, and one that finds none makes the next claim
(or waits again if another worker already does). So the keys reach as many
workers as wait, a wake-up apart, while a thread that holds the GIL and
runs short handlers takes the keys itself before the woken ones step:
then the wake-ups stop at the first that finds nothing, instead of one
per key (each a futex wake, a GIL hand-over and a wait again).

A finished key's ``done`` is not sent at once: ``report`` queues it, and the
next claim sends it (group commit). A ``done`` the server answers ``lost``
(the lease was taken back) is counted again as ``lease_lost`` in
``corrections``, which the runner adds to its tallies. When no key waits,
the claimant waits for the doorbell as ``get`` does; a worker that finishes
meanwhile sends the queued dones itself (a claim of no keys), so no ``done``
waits for an add.

A claimed key not yet handed to a worker when this client shuts down (or the
run ends) is put back at once, without a failure, all of them in one
``put_back`` script. Claimed keys are this client's holds like any other:
renewed with the rest, and lost back to the queue after the lease if the
process dies. One that waited for a worker until its lease was taken back,
or may have run out (the process stalled), is never handed out: it is put
back (a fenced put-back changes nothing if another holder has it).

Claims that take keys are one at a time per client and shard (its claim
turn), however many runs share the client: the server keeps one record per
client, of its last such claim, which the next one hands back if its reply
was lost; a second claim in flight would overwrite the record of the first.

On a sharded client (``shards=N``) each shard is claimed from as one queue
is, with its own claim script, record, turn, renewal and put-back; a claim
is a round over the shards (``_claim_rules``) that takes from the shards
with work in turn, and a claimant that found none waits for any shard
(``_shard_waits``: one watcher per shard, as the sharded ``get`` waits).

The state is ``ClaimBook``'s (``_claim_book``). The rules are ``ClaimRules``'
flows (``_flow.Flow``): they yield the calls to make, which ``Claims``
(threads: ``drive``, the book guarded by a condition) and ``AsyncClaims``
(``_async_claims``: ``adrive``, no lock) make, each its own way: a thread
waits on the condition, a task on a future, and a task's claim runs in a
task of its own.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from typing import Any

from .._flow import Flow, drive
from ._claim_book import Claimed, UnsentDone
from ._claim_rules import ClaimRules, WorkerHold

__all__ = ["Claims"]


class _PerThread(threading.local):
    """A worker thread's ``WorkerHold``."""

    worker: WorkerHold | None = None


class Claims(ClaimRules):
    """``run_workers``' view of a ``RedisWorkQueue``: its flows driven in the
    worker threads, the book guarded by a condition."""

    _new_turn = threading.Lock
    _turns: list[threading.Lock]

    def _start_view(self) -> None:
        guard = threading.RLock()
        self._cond = threading.Condition(guard)
        self._guard = guard  # the condition's lock: taken without its Python-level wrapper
        self._local = _PerThread()

    def get(self) -> str:
        """A key for this worker (``_get_flow``). Raises ``Empty`` once
        interrupted, ``ShutDown`` once the client is shut down (after sending
        the dones and putting back what was claimed)."""
        me = threading.get_ident()
        try:
            handed = self._hand_out_now(me)
            if handed is not None and not handed[1].suspect:
                return handed[0]
            return drive(self._get_flow(me, handed))
        finally:
            if self._book.stale:
                self._put_back_stale()

    def interrupt(self) -> None:
        """Wake every worker waiting for a key: each raises ``Empty``."""
        self._client.interrupt()
        with self._guard:
            self._cond.notify_all()

    def close(self, abort: bool) -> Flow[Counter[str]]:
        """The run ended: send the queued dones, put back what was claimed
        (one script). ``abort`` (Ctrl-C again: the workers were not waited
        for): the keys of handlers still running are put back too. Waits (up
        to a lease) for the claims that take keys in flight, so none comes after."""
        deadline = time.monotonic() + self._lease
        turns = [
            turn
            for turn in self._turns
            if turn.acquire(timeout=max(0.0, deadline - time.monotonic()))
        ]
        try:
            with self._guard:
                back, running = self._book.close(abort)
        finally:
            for turn in turns:
                turn.release()
        yield from self._send_last_dones()
        yield functools.partial(self._put_back, back)
        yield functools.partial(self._put_back, running, False)
        return self._book.corrections

    def _mine(self) -> WorkerHold | None:
        return self._local.worker

    def _set_mine(self, mine: WorkerHold | None) -> None:
        self._local.worker = mine

    def _claim_one(self, shard: int, dones: list[UnsentDone], want: int) -> Any:
        """A claim that takes keys waits for its shard's turn."""
        if not want:
            return drive(self._claim_flow(shard, dones, 0))
        with self._turns[shard]:
            with self._guard:
                if self._book.closed:
                    want = 0
            return drive(self._claim_flow(shard, dones, want))

    def _put_back(self, back: list[Claimed], finish: bool = True) -> list[bool]:
        return drive(self._put_back_flow(back, finish))

    def _put_back_stale(self) -> None:
        drive(self._put_back_stale_flow())

    def _wait_turn(self) -> None:
        """Wait on the condition, counted as blocked in get (as the claimant
        in ``BLPOP`` is; ``Getters.blocked`` under the client's lock)."""
        getters, lock = self._getters, self._holds.lock
        with lock:
            getters.blocked += 1
        try:
            self._cond.wait()
        finally:
            with lock:
                getters.blocked -= 1

    def _claimant_left(self, ok: bool) -> None:
        """With a key: wake one waiter, which takes a key left and wakes the
        next (``_woken_took``), or makes the next claim. A thread that holds
        the GIL may run several of the keys before a woken one does: then
        the wake-ups stop there instead of one per key finding none.
        Without: wake them all (the next claimant, or the interrupted)."""
        if ok:
            self._cond.notify()
        else:
            self._cond.notify_all()

    def _woken_took(self) -> None:
        """Pass the wake-up on: one waiter more, for the next key left or the next claim."""
        self._cond.notify()

    def _then(self, first: object, call: functools.partial[Any]) -> Any:
        return call()
