"""Spend ledger: reserve a call's worst case before sending, reconcile with the billed cost after.

What is covered: the *recorded* spend of a run (and of every earlier run sharing the ledger file)
never exceeds ``max_total_usd`` as long as each call's real charge is at most its reservation. The
reservation is the call's worst case, ``prompt_token_bound × input price + max_tokens × output
price``; ``max_tokens`` is always sent, so a provider that honours its list price cannot charge more.
A call whose outcome is unknown (timeout after sending, unreadable 200 body, crash while in flight)
is booked at its full reservation: the ledger may over-count, never under-count.

What is not covered: a provider charging above the prices in the ``TeacherSpec`` (the ledger then
records the true, higher cost, marks the run ``overrun`` and refuses further reservations); spend
made outside this ledger file. For a server-side cap, run with an OpenRouter key that has a limit.

The file is append-only JSONL: ``reserve`` before a request is sent, then ``settle`` (with the billed
USD) or ``release`` (nothing billed). A reserve without either, left by a crash, counts in full.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from composer_replication._io import JsonlAppender, read_jsonl

from .durable import GroupFsync

# Float sums drift by ~1e-16 per add; comparisons allow this much so a cap is not missed by rounding.
_EPS = 1e-12


@dataclass
class Reservation:
    id: str
    key: str
    usd: float


class SpendLedger:
    """An async-safe budget with an append-only on-disk record.

    Use from one event loop. ``reserve`` waits while other calls are in flight and the new call would
    not fit, because their settlements usually free part of their worst case; it returns None when
    nothing is in flight and the call still does not fit (the budget is spent).
    """

    def __init__(
        self, max_total_usd: float, path: str | os.PathLike[str] | None = None, *, fsync: bool = False
    ):
        if not max_total_usd >= 0:
            raise ValueError(f"max_total_usd must be >= 0, got {max_total_usd!r}")
        self.max_total_usd = float(max_total_usd)
        self.path = Path(path) if path is not None else None
        self.prior_usd = 0.0  # booked by earlier runs (settled + orphaned reserves)
        self.settled_usd = 0.0  # booked by this run
        self.inflight_usd = 0.0
        self._inflight: dict[str, Reservation] = {}
        self.overrun = False
        self._cond: asyncio.Condition | None = None
        self._seq = itertools.count()
        self._run = uuid.uuid4().hex[:8]
        if self.path is not None and self.path.exists():
            self.prior_usd = self._load(self.path)
        self._out = JsonlAppender(self.path, fsync=False, fast=True) if self.path is not None else None
        self._durable = GroupFsync(self.path) if (fsync and self.path is not None) else None

    @staticmethod
    def _load(path: Path) -> float:
        reserved: dict[str, float] = {}
        total = 0.0
        for rec in read_jsonl(path):
            ev, rid = rec.get("event"), rec.get("id")
            if ev == "reserve":
                reserved[rid] = float(rec["usd"])
            elif ev == "settle":
                reserved.pop(rid, None)
                total += float(rec["usd"])
            elif ev == "release":
                reserved.pop(rid, None)
        return total + sum(reserved.values())

    @property
    def spent_usd(self) -> float:
        """USD booked: earlier runs, plus this run's settled calls (in-flight reservations excluded)."""
        return self.prior_usd + self.settled_usd

    @property
    def committed_usd(self) -> float:
        """Booked plus reserved: the most this ledger can end up recording."""
        return self.spent_usd + self.inflight_usd

    @property
    def remaining_usd(self) -> float:
        return max(0.0, self.max_total_usd - self.committed_usd)

    def _write(self, rec: dict) -> None:
        if self._out is not None:
            rec["t"] = round(time.time(), 3)
            self._out.write(rec)
            if self._durable is not None:
                self._durable.wrote()

    def fits(self, usd: float) -> bool:
        return not self.overrun and self.committed_usd + usd <= self.max_total_usd + _EPS

    async def reserve(self, key: str, usd: float) -> Reservation | None:
        """Reserve ``usd`` for one call, waiting for in-flight calls to settle if that frees room."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            while not self.fits(usd):
                if not self._inflight or self.overrun:
                    return None
                await self._cond.wait()
            res = Reservation(id=f"{self._run}-{next(self._seq)}", key=key, usd=float(usd))
            self._inflight[res.id] = res
            self.inflight_usd += res.usd
            self._write({"event": "reserve", "id": res.id, "key": key, "usd": res.usd})
        if self._durable is not None:
            await self._durable.sync()  # the reservation is on disk before the request is sent
        return res

    async def _finish(self, res: Reservation, rec: dict, booked: float) -> None:
        assert res.id in self._inflight, "reservation settled twice"
        del self._inflight[res.id]
        self.inflight_usd = max(0.0, self.inflight_usd - res.usd) if self._inflight else 0.0
        self.settled_usd += booked
        if booked > res.usd + _EPS:
            self.overrun = True
            rec["overrun"] = True
        self._write(rec)
        if self._durable is not None:
            await self._durable.sync()
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()

    async def settle(self, res: Reservation, usd: float, *, note: str | None = None) -> None:
        """Book the billed cost of a call (may exceed the reservation only if the provider overcharged)."""
        rec = {"event": "settle", "id": res.id, "usd": float(usd)}
        if note:
            rec["note"] = note
        await self._finish(res, rec, float(usd))

    async def release(self, res: Reservation) -> None:
        """Nothing was billed (the request was refused or never reached the server)."""
        await self._finish(res, {"event": "release", "id": res.id}, 0.0)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
        if self._durable is not None:
            self._durable.close()
