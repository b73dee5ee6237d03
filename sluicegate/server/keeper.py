"""Everything between a partition and its store: lazy loads, rule sync, checkpoints.

* **Lazy loads**: the first check of a key loads its rule and checkpoint (a
  restarted server resumes from the checkpointed credit plus the refill
  since, under the rule now in force).
* **Rule sync**: every sync interval, read the rules that changed since the
  previous sync began (minus an overlap for writers' clock skew and slow
  commits) and apply them to held keys: the cost is what changed, not what is
  held.
* **Checkpoints**: at a fixed rate, write the credit of the buckets spent
  since the previous round; :meth:`StoreKeeper.flush` writes the last ones on
  shutdown.
* **Outages**: when the store is unavailable, keep deciding with the rules
  held, give new keys the default rule and reload them until a reload works,
  keep unwritten checkpoints dirty and retry with backoff; log the outage at
  most once a minute and count every failure.

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

from sluicegate.rules import RuleError, is_pattern_key
from sluicegate.server.partition import NEVER_FULL, Address, Partition, Taken
from sluicegate.store import Checkpoint, RuleStore, StoreError, StoreUnavailable
from sluicegate.store.base import MAX_LIST, NEVER_EXPIRES_NS

log = logging.getLogger("sluicegate.server")
Clock = Callable[[], int]
Send = Callable[[bytes, Address], None]
T = TypeVar("T")
SYNC_OVERLAP_S = 2.0  # re-read changes this far back: tolerates writers' clock skew and slow commits
MAX_BACKOFF_S = 30.0
LOG_EVERY_S = 60.0  # store problems are logged at most this often
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
        sync_overlap_s: float = SYNC_OVERLAP_S,
    ) -> None:
        self.partition = partition
        self.store = store
        self.send = send
        self.clock = clock
        self.wall_clock = wall_clock
        self.sync_interval_s = sync_interval_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self.sync_overlap_s = sync_overlap_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._loader: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._provisional: set[bytes] = set()  # keys on the default rule until a reload works
        self._synced_at = wall_clock() / 1e9  # rules loaded from now on are fresh
        self.patterns_loaded = False
        self.after_load: Callable[[], None] | None = None
        partition.wall_offset_ns = wall_clock() - clock()  # for calendar quotas
        self.store_down = False
        self._store_back = asyncio.Event()  # wakes the checkpoint loop out of its backoff
        self._logged_at = -LOG_EVERY_S
        self.outages = 0

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._sync_loop()), asyncio.ensure_future(self._checkpoint_loop())]

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        """Run a store call on the store thread; note outages (unavailable) and recoveries."""
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        except (StoreError, RuleError) as exc:  # RuleError: a stored row that is not a valid rule
            self.partition.store_errors += 1
            if isinstance(exc, StoreUnavailable) and not self.store_down:
                self.store_down = True
                self.outages += 1
            what = "store unavailable" if isinstance(exc, StoreUnavailable) else "store error"
            self._log(f"{what}, deciding with the rules held: {exc}")
            raise StoreError(str(exc)) from exc
        if self.store_down:
            self.store_down = False
            self._store_back.set()
            log.warning("store available again")
        return result

    def _log(self, message: str) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("%s", message)

    # -- lazy loads -------------------------------------------------------------------------

    def need_rules(self) -> None:
        if self.partition.wants_rules and self._loader is None:
            self._loader = asyncio.ensure_future(self._load())

    async def _load(self) -> None:
        partition = self.partition
        try:
            while keys := partition.keys_to_load():
                try:
                    if self.store_down:  # known down: answer now; the sync loop notices when it is back
                        raise StoreError("store down")
                    replies = await self._load_keys(keys)
                    self._provisional.difference_update(keys)
                except Exception as exc:  # any failure must still answer the parked checks
                    if not isinstance(exc, StoreError):
                        log.exception("rule load failed")
                    new, replies = partition.rules_failed(keys, self.clock())
                    self._provisional.update(new)
                for reply, addr in replies:
                    self.send(reply, addr)
                if self.after_load is not None:
                    self.after_load()  # loads may have queued waiting requests: the adapter times them
                # Buckets live as long as the process and never form cycles: take them out of
                # the cycle collector's full passes (O(1)), which otherwise stall the loop for
                # tens of milliseconds per pass once a partition holds many keys. Young cyclic
                # garbage (e.g. tracebacks of failed loads) is collected first, not frozen.
                gc.collect(1)
                gc.freeze()
        finally:
            self._loader = None

    async def _load_keys(self, keys: list[bytes]) -> list[tuple[bytes, Address]]:
        names = {key.decode("utf-8"): key for key in keys}
        found, saved = await self._call(self._read, list(names))
        now = self.clock()
        offset = self.wall_clock() - now
        rules = {key: found.get(name) for name, key in names.items()}
        checkpoints = {names[name]: (cp.credit, cp.at_ns - offset, cp.quotas) for name, cp in saved.items()}
        return self.partition.rules_loaded(rules, now, checkpoints)

    def _read(self, names: list[str]) -> tuple[dict, dict]:
        # Every checkpoint, expired or not: its expiry was computed under the rule of its day,
        # and the restore refills under today's rule (capped at the capacity).
        return self.store.get_rules(names), self.store.get_checkpoints(names, now_ns=0)

    # -- rule sync --------------------------------------------------------------------------

    async def load_patterns(self) -> bool:
        """Read every pattern rule (at start; again at each sync until it worked)."""
        try:
            patterns = await self._call(self.store.list_patterns)
        except StoreError:
            return False
        self.partition.set_patterns(patterns, self.clock())
        self.patterns_loaded = True
        return True

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except StoreError:
                pass  # counted and logged by _call; the next round retries
            except Exception:
                log.exception("rule sync failed")

    async def sync(self) -> int:
        """Apply the rules changed since the previous sync to held keys; returns how many were read."""
        started = self.wall_clock() / 1e9
        since = self._synced_at - self.sync_overlap_s
        if not self.patterns_loaded and not await self.load_patterns():
            raise StoreError("patterns not loaded")
        read = 0
        while True:
            changes = await self._call(self.store.changed_since, since)
            read += len(changes)
            if changes:
                # Patterns may match keys of any partition: every partition takes every pattern change.
                patterns = {change.key: change.rule for change in changes if is_pattern_key(change.key)}
                by_key = {change.key.encode("utf-8"): change.rule for change in changes if change.key not in patterns}
                now = self.clock()
                if patterns:
                    self.partition.apply_pattern_changes(patterns, now)
                self.partition.apply_rule_changes(by_key, now)
                since = changes[-1].updated_at  # change times are distinct: page forward
            if len(changes) < MAX_LIST:
                break
        # The next sync starts from this one's start (our clock, so a writer whose clock
        # runs ahead cannot push it into the future), minus the overlap.
        self._synced_at = started
        if self._provisional:
            self.partition.reload(self._provisional)
            self.need_rules()
        return read

    # -- checkpoints ------------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.checkpoint_interval_s
        rounds = 0
        while True:
            try:
                await asyncio.wait_for(self._store_back.wait(), delay)  # or earlier, once the store is back
            except TimeoutError:
                pass
            self._store_back.clear()
            started = loop.time()
            self.partition.wall_offset_ns = self.wall_clock() - self.clock()  # follows wall-clock steps
            try:
                await self.write_checkpoints()
                delay = max(0.0, self.checkpoint_interval_s - (loop.time() - started))  # a fixed rate
            except StoreError:
                delay = min(MAX_BACKOFF_S, max(delay, self.checkpoint_interval_s) * 2)
            except Exception:
                log.exception("checkpoint round failed")
                delay = self.checkpoint_interval_s
            rounds += 1
            if rounds % SWEEP_EVERY == 0 and not self.store_down:
                try:
                    await self._call(self.store.sweep, self.wall_clock())
                except StoreError:
                    pass  # a sweep is housekeeping: it never slows checkpoints down

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
            except BaseException:
                # Not lost (also when cancelled): the next round takes these keys' newest credit.
                self.partition.mark_dirty(key for key, *_ in taken)
                raise
        return written

    def _write_taken(self, taken: list[Taken], offset: int) -> int:
        # On the store thread: mono -> wall times, and the objects the store wants. A checkpoint
        # with quota counters lives until their window ends, even if the bucket is full by then.
        return self.store.put_checkpoints(
            Checkpoint(
                key.decode("utf-8"),
                credit,
                at + offset,
                NEVER_EXPIRES_NS if full_at == NEVER_FULL else max(full_at + offset, quotas_until),
                quotas,
            )
            for key, credit, at, full_at, quotas, quotas_until in taken
        )

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Stop the loops, let a running load finish, write the last checkpoints (SIGTERM on Fargate)."""
        for task in self._tasks:
            task.cancel()
        try:
            async with asyncio.timeout(timeout_s):
                if self._loader is not None:
                    await asyncio.shield(self._loader)  # its answers charge buckets too
                while self.partition.dirty_count:
                    await self.write_checkpoints()
        except (StoreError, TimeoutError):
            log.error("final checkpoint not written; a restart may admit up to one interval's spending again")

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
