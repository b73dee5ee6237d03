"""Everything between a partition and its store: lazy loads, rule sync, checkpoints.

* **Lazy loads**: the first check of a key loads its rule and checkpoint (a
  restarted server resumes from the checkpointed credit plus the refill
  since).
* **Rule sync**: every sync interval, read the rules that changed since the
  last sync (cost: what changed, not what is held) and apply them to held keys.
* **Checkpoints**: every checkpoint interval, write the credit of buckets spent
  since the last round; :meth:`StoreKeeper.flush` writes the last ones on
  shutdown.
* **Outages**: when the store fails, keep deciding with the rules held, give
  new keys the default rule and reload them later, keep unwritten checkpoints
  dirty and retry with backoff; log the outage once and count every failure.

All store calls run on one worker thread, in order, off the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sluicegate.rules import RuleError
from sluicegate.server.partition import NEVER_FULL, Address, Partition
from sluicegate.store import Checkpoint, RuleStore, StoreError
from sluicegate.store.base import MAX_LIST, NEVER_EXPIRES_NS

log = logging.getLogger("sluicegate.server")
Clock = Callable[[], int]
Send = Callable[[bytes, Address], None]
T = TypeVar("T")
SYNC_OVERLAP_S = 2.0  # re-read changes this far back: tolerates writers' clock skew and slow commits
MAX_BACKOFF_S = 30.0
CHECKPOINT_CHUNK = 2000  # buckets taken per store call (bounds the time the loop spends on it)
SWEEP_EVERY = 60  # checkpoint rounds between sweeps of expired checkpoints (SQL stores)


class StoreKeeper:
    """Moves state between ``partition`` and ``store``; ``send`` delivers replies that loads release."""

    def __init__(
        self,
        partition: Partition,
        store: RuleStore,
        send: Send,
        *,
        clock: Clock = time.monotonic_ns,
        wall_clock: Clock = time.time_ns,
        sync_interval_s: float = 1.0,
        checkpoint_interval_s: float = 1.0,
    ) -> None:
        self.partition = partition
        self.store = store
        self.send = send
        self.clock = clock
        self.wall_clock = wall_clock
        self.sync_interval_s = sync_interval_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._loader: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._provisional: set[bytes] = set()  # keys given the default rule during an outage
        self._watermark = wall_clock() / 1e9  # rules loaded from now on are fresh
        self.store_down = False
        self._store_back = asyncio.Event()  # wakes the checkpoint loop out of its backoff
        self.outages = 0

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._sync_loop()), asyncio.ensure_future(self._checkpoint_loop())]

    def wall_ns(self, mono_ns: int) -> int:
        return mono_ns + self.wall_clock() - self.clock()

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        """Run a store call on the store thread; note outages and recoveries (logged once each)."""
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        except (StoreError, RuleError) as exc:  # RuleError: a stored row that is not a valid rule
            self.partition.store_errors += 1
            if not self.store_down:
                self.store_down = True
                self.outages += 1
                log.warning("store unavailable, deciding with the rules held: %s", exc)
            raise StoreError(str(exc)) from exc
        if self.store_down:
            self.store_down = False
            self._store_back.set()
            log.warning("store available again")
        return result

    # -- lazy loads -------------------------------------------------------------------------

    def need_rules(self) -> None:
        if self.partition.wants_rules and self._loader is None:
            self._loader = asyncio.ensure_future(self._load())

    async def _load(self) -> None:
        partition = self.partition
        try:
            while keys := partition.keys_to_load():
                names = {key.decode("utf-8"): key for key in keys}
                try:
                    if self.store_down:  # known down: answer now; the sync loop notices when it is back
                        raise StoreError("store down")
                    found, saved = await self._call(self._read, list(names))
                except StoreError:
                    new, replies = partition.rules_failed(keys, self.clock())
                    self._provisional.update(new)
                else:
                    now = self.clock()
                    offset = self.wall_clock() - now
                    rules = {key: found.get(name) for name, key in names.items()}
                    checkpoints = {
                        names[name]: (checkpoint.credit, checkpoint.at_ns - offset)
                        for name, checkpoint in saved.items()
                    }
                    replies = partition.rules_loaded(rules, now, checkpoints)
                for reply, addr in replies:
                    self.send(reply, addr)
                # Buckets live as long as the process and never form cycles: take them out of
                # the cycle collector's full passes (O(1)), which otherwise stall the loop for
                # tens of milliseconds per pass once a partition holds many keys.
                gc.freeze()
        finally:
            self._loader = None

    def _read(self, names: list[str]) -> tuple[dict, dict]:
        return self.store.get_rules(names), self.store.get_checkpoints(names, self.wall_clock())

    # -- rule sync --------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except StoreError:
                pass  # counted and logged by _call; the next round retries

    async def sync(self) -> int:
        """Apply the rules changed since the last sync to held keys; returns how many were read."""
        since = self._watermark - SYNC_OVERLAP_S
        read = 0
        while True:
            changes = await self._call(self.store.changed_since, since)
            read += len(changes)
            if changes:
                by_key = {change.key.encode("utf-8"): change.rule for change in changes}
                self.partition.apply_rule_changes(by_key, self.clock())
                since = changes[-1].updated_at  # change times are distinct: page forward
                self._watermark = max(self._watermark, since)
            if len(changes) < MAX_LIST:
                break
        if self._provisional:
            self.partition.reload(self._provisional)
            self._provisional.clear()
            self.need_rules()
        return read

    # -- checkpoints ------------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        delay = self.checkpoint_interval_s
        rounds = 0
        while True:
            self._store_back.clear()
            try:
                await asyncio.wait_for(self._store_back.wait(), delay)  # or earlier, once the store is back
            except TimeoutError:
                pass
            try:
                await self.write_checkpoints()
                rounds += 1
                if rounds % SWEEP_EVERY == 0:
                    await self._call(self.store.sweep, self.wall_clock())
                delay = self.checkpoint_interval_s
            except StoreError:
                delay = min(MAX_BACKOFF_S, delay * 2)

    async def write_checkpoints(self) -> int:
        """Write the credit of every bucket spent since the last round; returns how many.

        A chunk at a time: the loop serves checks while the store thread builds
        and writes each chunk, so a partition with many busy keys does not stall.
        """
        written = 0
        # Only what was dirty when the round began: keys spent meanwhile wait for the next
        # round, or a busy partition would keep the store thread writing forever.
        budget = self.partition.dirty_count
        while budget > 0:
            chunk = min(CHECKPOINT_CHUNK, budget)
            budget -= chunk
            taken = self.partition.take_checkpoints(self.clock(), limit=chunk)
            if not taken:
                continue
            try:
                written += await self._call(self._write_taken, taken, self.wall_clock() - self.clock())
            except StoreError:
                # Not lost: the next round takes these keys' newest credit.
                self.partition.mark_dirty(key for key, *_ in taken)
                raise
        return written

    def _write_taken(self, taken: list[tuple[bytes, int, int, int]], offset: int) -> int:
        # On the store thread: mono -> wall times, and the objects the store wants.
        return self.store.put_checkpoints(
            Checkpoint(
                key.decode("utf-8"),
                credit,
                at + offset,
                NEVER_EXPIRES_NS if full_at == NEVER_FULL else full_at + offset,
            )
            for key, credit, at, full_at in taken
        )

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Stop the loops and write the last checkpoints (what SIGTERM on Fargate gives time for)."""
        for task in self._tasks:
            task.cancel()
        try:
            await asyncio.wait_for(self.write_checkpoints(), timeout_s)
        except (TimeoutError, StoreError):
            log.error("final checkpoint not written; a restart may admit up to one interval's spending again")

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
