"""Spend ledger: reserve a call's worst case before sending, reconcile with the billed cost after.

What is covered: the *recorded* spend of a run, of every earlier run sharing the ledger file, and of
every other process writing the same file at the same time, never exceeds ``max_total_usd`` as long
as each call's real charge is at most its reservation. The reservation is the call's worst case,
``prompt_token_bound × input price + max_tokens × output price``; ``max_tokens`` is always sent, so a
provider that honours its list price cannot charge more. A call whose outcome is unknown (timeout
after sending, unreadable 200 body, malformed usage, crash while in flight) is booked at its full
reservation: the ledger may over-count, never under-count. No amount below zero is ever booked:
``settle`` refuses one, and a file holding one is rejected when it is read.

Processes sharing the file: every reserve, settle and release takes an exclusive ``flock`` on the
file, reads what the others appended since, checks the cap against everything booked or reserved
by anyone, appends, and unlocks. A reservation another process left open counts in full until it is
settled (a crashed process's open reservations count for good), so two processes may leave budget
unused; they can never exceed the cap together.

What is not covered: a provider charging above the prices in the ``TeacherSpec`` (the ledger then
records the true, higher cost, marks the run ``overrun`` and refuses further reservations); spend
made outside this ledger file; file systems where ``flock`` is not shared between hosts (NFS
without lock support). For a server-side cap, run with an OpenRouter key that has a limit.

The file is append-only JSONL: ``reserve`` before a request is sent, then ``settle`` (with the billed
USD) or ``release`` (nothing billed). A reserve without either, left by a crash, counts in full.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import math
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from composer_replication._io import DataFileError

from .durable import GroupFsync

# Float sums drift by ~1e-16 per add; comparisons allow this much so a cap is not missed by rounding.
_EPS = 1e-12


class SpendOverrun(RuntimeError):
    """The ledger holds more than its cap: a provider billed above the prices the run was planned with."""

    exit_code = 4


@dataclass
class Reservation:
    id: str
    key: str
    usd: float


def _amount(rec: dict, path: Path | str, line: int) -> float:
    usd = rec.get("usd")
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd < 0:
        raise DataFileError(
            path,
            line,
            f"{rec.get('event')} of {usd!r} USD: a ledger amount must be a finite number >= 0, so the total "
            "this file holds cannot be trusted",
            "no call can credit the budget; an older version booked negative server-reported costs: "
            "move this ledger aside and start a new one, after checking your real spend on the provider's site",
        )
    return float(usd)


class _Book:
    """Totals of a ledger file as read so far: settled USD and reservations still open, by id."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.settled = 0.0
        self.open: dict[str, float] = {}
        self.lines = 0

    def apply(self, raw: bytes) -> None:
        self.lines += 1
        if not raw.strip():
            return
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise DataFileError(
                self.path, self.lines, f"not valid JSON: {exc}", "fix or delete this line"
            ) from None
        if not isinstance(rec, dict):
            raise DataFileError(self.path, self.lines, f"expected a JSON object, got {type(rec).__name__}")
        ev, rid = rec.get("event"), str(rec.get("id"))
        if ev == "reserve":
            self.open[rid] = _amount(rec, self.path, self.lines)
        elif ev == "settle":
            usd = _amount(rec, self.path, self.lines)
            self.open.pop(rid, None)
            self.settled += usd
        elif ev == "release":
            self.open.pop(rid, None)

    @property
    def total(self) -> float:
        return self.settled + sum(self.open.values())


def ledger_total(path: str | os.PathLike[str]) -> float:
    """USD a ledger file books: settled calls plus reservations left open. Raises ``DataFileError``
    (naming the line) on a malformed record or an amount below zero; 0.0 if the file does not exist."""
    p = Path(path)
    if not p.exists():
        return 0.0
    book = _Book(p)
    data = p.read_bytes()
    end = data.rfind(b"\n") + 1  # a torn last line (crash mid-append) was never acted on
    for raw in data[:end].split(b"\n")[:-1]:
        book.apply(raw)
    return book.total


class SpendLedger:
    """An async-safe budget with an append-only on-disk record, shared safely between processes.

    Use from one event loop. ``reserve`` waits while this ledger's own calls are in flight and the
    new call would not fit, because their settlements usually free part of their worst case; it
    returns None when none of its calls is in flight and the call still does not fit.
    """

    def __init__(
        self, max_total_usd: float, path: str | os.PathLike[str] | None = None, *, fsync: bool = False
    ):
        if not (max_total_usd >= 0 and math.isfinite(max_total_usd)):
            raise ValueError(f"max_total_usd must be a finite number >= 0, got {max_total_usd!r}")
        self.max_total_usd = float(max_total_usd)
        self.path = Path(path) if path is not None else None
        self.settled_usd = 0.0  # booked by this ledger object
        self.inflight_usd = 0.0
        self._inflight: dict[str, Reservation] = {}
        self.overrun = False
        self._cond: asyncio.Condition | None = None
        self._seq = itertools.count()
        self._run = uuid.uuid4().hex[:8]
        self._others = _Book(self.path or "<memory>")  # earlier runs and other processes
        self._fd: int | None = None
        self._offset = 0
        self._durable = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                try:
                    self._catch_up()
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            except BaseException:
                os.close(self._fd)
                raise
            self._durable = GroupFsync(self.path) if fsync else None

    # -- the shared file ---------------------------------------------------------------------------
    @property
    def _file(self) -> int:
        """The ledger file's descriptor (the methods below run only for a ledger with a file)."""
        assert self._fd is not None
        return self._fd

    def _catch_up(self) -> None:
        """With the lock held: apply what other writers appended since our last read."""
        size = os.fstat(self._file).st_size
        if size <= self._offset:
            return
        data = os.pread(self._file, size - self._offset, self._offset)
        end = data.rfind(b"\n") + 1
        mine = f'"id":"{self._run}-'.encode()
        for raw in data[:end].split(b"\n")[:-1]:
            if mine in raw:  # our own record (only if a write raced a failed lock; never double-count)
                self._others.lines += 1
                continue
            self._others.apply(raw)
        self._offset += end
        if end < len(data):
            # Bytes after the last newline while we hold the lock: a writer died mid-append. Its
            # record never took effect (a request is sent only after its reserve line is written).
            os.ftruncate(self._file, self._offset)

    async def _lock(self) -> None:
        delay = 0.0005
        while True:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                await asyncio.sleep(delay)  # another process holds it for microseconds; keep the loop free
                delay = min(delay * 2, 0.02)

    def _append(self, rec: dict) -> None:
        """With the lock held and caught up: append one record."""
        rec["t"] = round(time.time(), 3)
        line = orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)
        os.write(self._file, line)
        self._offset += len(line)
        if self._durable is not None:
            self._durable.wrote()

    async def _locked_append(self, rec: dict, check: float | None = None) -> bool:
        """Append ``rec``; with ``check``, only if ``check`` USD still fits. Returns whether it wrote."""
        if self._fd is None:
            if check is not None and not self.fits(check):
                return False
            return True
        await self._lock()
        try:
            self._catch_up()
            if check is not None and not self.fits(check):
                return False
            self._append(rec)
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- totals ------------------------------------------------------------------------------------
    @property
    def prior_usd(self) -> float:
        """USD booked or reserved by others sharing the file (earlier runs, other processes), as last read."""
        return self._others.total

    @property
    def spent_usd(self) -> float:
        """USD booked: others (see ``prior_usd``) plus this ledger's settled calls (its in-flight excluded)."""
        return self.prior_usd + self.settled_usd

    @property
    def committed_usd(self) -> float:
        """Booked plus reserved: the most this ledger can end up recording."""
        return self.spent_usd + self.inflight_usd

    @property
    def remaining_usd(self) -> float:
        return max(0.0, self.max_total_usd - self.committed_usd)

    @property
    def over_cap(self) -> bool:
        """The file books more than the cap (only possible when a provider billed above its reservation)."""
        return self.overrun or self.spent_usd > self.max_total_usd + _EPS

    def fits(self, usd: float) -> bool:
        return not self.overrun and self.committed_usd + usd <= self.max_total_usd + _EPS

    def refresh(self) -> None:
        """Read what other processes appended (for an up-to-date ``prior_usd``)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._catch_up()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- reserve / settle --------------------------------------------------------------------------
    async def reserve(self, key: str, usd: float) -> Reservation | None:
        """Reserve ``usd`` for one call, waiting for in-flight calls to settle if that frees room."""
        if not (usd >= 0 and math.isfinite(usd)):
            raise ValueError(f"a reservation must be a finite number >= 0, got {usd!r}")
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            while True:
                res = Reservation(id=f"{self._run}-{next(self._seq)}", key=key, usd=float(usd))
                rec = {"event": "reserve", "id": res.id, "key": key, "usd": res.usd}
                if await self._locked_append(rec, check=res.usd):
                    break
                if not self._inflight or self.overrun:
                    return None
                await self._cond.wait()
            self._inflight[res.id] = res
            self.inflight_usd += res.usd
        if self._durable is not None:
            await self._durable.sync()  # the reservation is on disk before the request is sent
        return res

    async def _finish(self, res: Reservation, rec: dict, booked: float) -> None:
        assert res.id in self._inflight, "reservation settled twice"
        if booked > res.usd + _EPS:
            rec["overrun"] = True
        await self._locked_append(rec)
        del self._inflight[res.id]
        self.inflight_usd = max(0.0, self.inflight_usd - res.usd) if self._inflight else 0.0
        self.settled_usd += booked
        if booked > res.usd + _EPS:
            self.overrun = True
        if self._durable is not None:
            await self._durable.sync()
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()

    async def settle(self, res: Reservation, usd: float, *, note: str | None = None) -> None:
        """Book the billed cost of a call (may exceed the reservation only if the provider overcharged).

        Raises ``ValueError`` for an amount below zero or not finite: nothing may credit the budget.
        """
        if (
            isinstance(usd, bool)
            or not isinstance(usd, (int, float))
            or not (math.isfinite(usd) and usd >= 0)
        ):
            raise ValueError(f"refusing to book {usd!r} USD: a settled amount must be a finite number >= 0")
        rec = {"event": "settle", "id": res.id, "usd": float(usd)}
        if note:
            rec["note"] = note
        await self._finish(res, rec, float(usd))

    async def release(self, res: Reservation) -> None:
        """Nothing was billed (the request was refused or never reached the server)."""
        await self._finish(res, {"event": "release", "id": res.id}, 0.0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._durable is not None:
            self._durable.close()
            self._durable = None
