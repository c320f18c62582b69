"""``FencedTask``: a Celery task whose every run holds a lease and whose writes carry its fencing token.

The lifecycle (DESIGN.md §3) brackets the body inside ``__call__``, the one place Celery runs both in a
worker and in eager ``apply()``, and before the result is stored:

1. acquire the key's lease (a finished key returns its stored result unrun; a held one goes to
   ``fence_on_busy``, or is absorbed when the holder is a copy of this very task id);
2. the process's renewer keeps the lease alive while the body runs;
3. the return value is completed with the token; a refused run (``StaleToken``/``LeaseLost``) stores
   nothing in the result backend: it ends with ``Ignore`` when a newer holder exists, or re-queues itself
   (same id) when the lease only lapsed, so the work is never dropped;
4. an exception or ``self.retry()`` releases the lease so the next attempt acquires at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

from celery import Task, states
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore
from celery.signals import celeryd_after_setup, celeryd_init, worker_process_shutdown, worker_shutdown

from . import _headers, codec
from ._events import send_fence_event
from ._owed import Stranded
from ._runinfo import run_info
from ._runtime import runtime_for
from .config import FenceConfig
from .errors import FenceError, LeaseHeld, StoreUnavailable
from .fence import Fence
from .keys import derive_key
from .lease import Lease, LeaseState
from .renewer import OnLost, OnRenewed
from .run import Run, quietly
from .signals import (
    lease_acquired,
    lease_duplicate,
    lease_lost,
    lease_released,
    lease_renewed,
    lease_takeover,
    store_wait_exhausted,
    write_refused,
)
from .worker.bootstep import add_worker_steps, settle_owed_records
from .worker.startup import check_worker_at_start

__all__ = ["FencedTask"]

log = logging.getLogger(__name__)


class FencedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Base class for fenced tasks: ``@app.task(base=FencedTask, bind=True, fence_key="order:{order_id}")``.

    Task options (each overrides the app's ``fence_*`` setting of the same name for this task):
    ``fence_key`` (format string over the arguments, or callable; default: the task id),
    ``fence_lease_ttl``, ``fence_on_busy`` (``"retry"``, ``"ignore"``, ``"fail"``), ``fence_interrupt``.
    """

    Request = "celery_fence.worker.request:FencedRequest"  # releases the lease of a pool process that died
    fence_key: ClassVar[str | Callable[..., str] | None] = None
    fence_lease_ttl: ClassVar[float | None] = None
    fence_on_busy: ClassVar[str | None] = None
    fence_interrupt: ClassVar[bool | None] = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Hook the worker's start (its steps, the settings check) and the end of its processes (records they
        owe the store), once per process whatever the number of tasks."""
        celeryd_init.connect(add_worker_steps, weak=False, dispatch_uid="celery_fence.worker_steps")
        celeryd_after_setup.connect(check_worker_at_start, weak=False, dispatch_uid="celery_fence.startup")
        for ending in (worker_process_shutdown, worker_shutdown):  # a pool process, the worker: owed records
            ending.connect(settle_owed_records, weak=False, dispatch_uid=f"celery_fence.owed.{ending.name}")

    @property
    def fence(self) -> Fence:
        """The lease this run holds (only while a fenced run executes its body)."""
        fence: Fence | None = getattr(self.request, "_fence", None)
        if fence is None:
            raise FenceError(
                f"{self.name}: self.fence exists only while the task runs through a worker, .apply() "
                "or .delay(); a direct call runs the body as a plain function, without a lease"
            )
        return fence

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        if request is None or request.called_directly:  # a plain function call: no message, no lease
            return super().__call__(*args, **kwargs)
        runtime = runtime_for(self.app)
        config = runtime.config.with_task_options(
            self.fence_lease_ttl, self.fence_on_busy, self.fence_interrupt
        )
        key, _ = derive_key(self, args, kwargs)
        handoff = _headers.whole(request, _headers.HANDOFF)
        awaited = _headers.whole(request, _headers.AWAITED)
        run = Run(self, runtime, config, key, self._run_info(args, kwargs), handoff, awaited)
        return run.execute(args, kwargs)

    def signature_from_request(self, request: Any = None, *args: Any, **options: Any) -> Any:
        """Every copy this run sends of itself (``retry``, a re-queue) names the token it hands over, so
        the copy can take the key back at once if this attempt's release does not reach the store."""
        signature = super().signature_from_request(request, *args, **options)
        fence = getattr(request if request is not None else self.request, "_fence", None)
        if fence is not None:
            sent = dict(signature.options.get("headers") or {})
            sent[_headers.HANDOFF] = fence.token
            signature.options["headers"] = sent
        return signature

    # -- what a run asks of its task (run.RunHost) --

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.run(*args, **kwargs)

    def started(self, fence: Fence) -> tuple[OnLost, OnRenewed]:
        """The lease is held: expose it as ``self.fence``, tell the world, and say how to hear of its loss."""
        request = self.request  # the renewer's thread has no request of its own
        request._fence = fence
        runtime = runtime_for(self.app)
        fields = {"key": fence.key, "token": fence.token, "task_id": request.id}
        lease_acquired.send(sender=self, **fields)
        if fence.lease.taken_over:  # the store said so in the acquire itself: no extra round trip
            expired_for = fence.lease.expired_for
            lease_takeover.send(sender=self, expired_for=expired_for, **fields)
            # Only an exceptional acquire is published: an event per run cost a seventh of the throughput.
            event = {"key": fence.key, "token": fence.token, "expired_for": expired_for}
            send_fence_event(self, request, "takeover", **event)
        request._fence_started = time.monotonic()

        def on_lost(lost: Lease, reason: str) -> None:
            fence.mark_lost(reason)
            log.warning("fence lease lost: %s token %d (%s): %s", lost.key, lost.token, self.name, reason)
            lease_lost.send(sender=self, reason=reason, **fields)
            send_fence_event(self, request, "lost", key=lost.key, token=lost.token, reason=reason)
            runtime.interrupter.fire_for(fence)  # only a run armed with fence_interrupt is interrupted

        return on_lost, lambda _: lease_renewed.send(sender=self, **fields)

    def ended(self, fence: Fence) -> None:
        request = self.request
        held = time.monotonic() - getattr(request, "_fence_started", time.monotonic())
        request._fence = None
        lease_released.send(sender=self, held=held, key=fence.key, token=fence.token, task_id=request.id)

    def duplicate(self, key: str, token: int, reason: str) -> None:
        log.info("fence: duplicate delivery of %s absorbed: %s (token %d)", key, reason, token)
        send_fence_event(self, self.request, "duplicate", key=key, token=token, reason=reason)
        lease_duplicate.send(sender=self, key=key, token=token, task_id=self.request.id, reason=reason)

    def refused(self, fence: Fence, reason: str) -> None:
        log.warning("fence refused %s[%s]: %s", self.name, self.request.id, reason)
        write_refused.send(
            sender=self, key=fence.key, token=fence.token, task_id=self.request.id, reason=reason
        )
        send_fence_event(self, self.request, "refused", key=fence.key, token=fence.token, exception=reason)

    def delivered(self) -> bool | None:
        """Whether the result backend already holds SUCCESS for this task id: the run that stored it also
        sent its callbacks (Celery sends them first), so a copy must not send them again. ``None``: nothing
        can tell (eager ``apply()``, no result backend)."""
        if self.request.is_eager or isinstance(self.backend, DisabledBackend):
            return None
        try:
            return bool(self.backend.get_task_meta(self.request.id).get("status") == states.SUCCESS)
        except Exception as exc:  # a backend that cannot answer: deliver again (at least once)
            log.warning("fence: could not read the result of %s: %s", self.request.id, exc)
            return False

    def requeue(
        self, countdown: float, handing_back: Lease | None = None, cause: BaseException | None = None
    ) -> NoReturn:
        """Send this message again (same id) without touching the result backend, then end with Ignore.

        A lease handed back is released only once the message is sent again: if it cannot be (max_retries),
        the lease stays to expire, so recovery finds the run abandoned instead of losing it.
        """
        request = self.request
        store = runtime_for(self.app).store
        if request.is_eager:  # apply() has no queue to go back to: the caller sees why
            if handing_back is not None:
                quietly(store.release, handing_back)
            raise cause if cause is not None else Ignore()
        if self.max_retries is not None and request.retries >= self.max_retries:
            log.error(
                "fence: %s[%s] not re-queued: max_retries reached; recovery will find it once its "
                "lease expires",
                self.name,
                request.id,
            )
            raise Ignore()
        self.signature_from_request(request, countdown=countdown, retries=request.retries + 1).apply_async()
        if handing_back is not None:
            quietly(store.release, handing_back)  # the copy just sent may start at once
        raise Ignore()

    def busy(self, held: LeaseHeld, config: FenceConfig) -> Any:
        """Another task holds the key: ``fence_on_busy`` decides."""
        countdown = config.policy.busy_countdown(held.expires_in)
        if config.on_busy == "ignore":  # ends ready, never PENDING: the caller learns who holds the key
            lease_duplicate.send(sender=self, key=held.key, token=0, task_id=self.request.id, reason="held")
            send_fence_event(self, self.request, "duplicate", key=held.key, token=0, reason=str(held))
            self._store_failure(held)
            raise Ignore()
        if config.on_busy == "fail":
            raise held
        return self.retry(exc=held, countdown=countdown)

    def wait_out(
        self, exc: StoreUnavailable, config: FenceConfig, key: str, run_info: codec.Encoded
    ) -> NoReturn:
        """The store did not answer the acquire: nothing ran and no lease is held. Send this message again
        later (backoff), without spending ``max_retries``, until ``fence_store_wait`` seconds have passed
        since the first failure (carried in the message); then give up where an operator looks: the log,
        the ``store_wait_exhausted`` signal, and the key marked dead in the store (``_strand``)."""
        request = self.request
        since = _headers.seconds(request, _headers.WAITING_SINCE) or time.time()
        waits = _headers.whole(request, _headers.WAITS) or 0
        waited = time.time() - since
        if request.is_eager or waited >= config.store_wait:
            log.error(
                "fence: gave up on %s[%s] (key %r): the store stayed unavailable for %.0fs "
                "(fence_store_wait %gs); the body never ran: %s",
                self.name, request.id, key, waited, config.store_wait, exc,
            )
            store_wait_exhausted.send(sender=self, key=key, task_id=request.id, waited=waited)
            self._strand(key, run_info, f"{waited:.0f}s, fence_store_wait {config.store_wait:g}s")
            raise exc
        countdown = min(config.policy.interval * 2**waits, 60.0, config.store_wait - waited)
        log.warning(
            "fence: store unavailable for %s[%s] (key %r), waiting it out (again in %.1fs, "
            "max_retries not spent): %s", self.name, request.id, key, countdown, exc,
        )
        self._send_again(countdown, {_headers.WAITING_SINCE: since, _headers.WAITS: waits + 1})

    def look_again(self, held: LeaseHeld, config: FenceConfig) -> NoReturn:
        """A run of this very task id holds the key: this copy (a redelivery) looks again in case the holder
        dies, soon, then less often; nothing failed, so ``max_retries`` is not spent (nor dropped for it)."""
        request = self.request
        if request.is_eager:  # apply() has no queue to go back to
            raise Ignore()
        looks = _headers.whole(request, _headers.LOOKS) or 0
        countdown = config.policy.look_again_countdown(held.expires_in, looks)
        log.info("fence: %s[%s] looks at %s again in %.1fs", self.name, request.id, held.key, countdown)
        self._send_again(countdown, {_headers.LOOKS: looks + 1})

    def await_delivery(self, key: str, token: int, config: FenceConfig) -> NoReturn:
        """A run of this task id finished the key, SUCCESS not stored: it may be sending its callbacks now.
        Look again after a ttl; still not delivered then, that run died first and this copy delivers."""
        request = self.request
        countdown = config.policy.ttl
        log.info(
            "fence: %s[%s] finds %s finished, not delivered yet: looks again in %.1fs",
            self.name, request.id, key, countdown,
        )
        self._send_again(countdown, {_headers.AWAITED: token})

    def _send_again(self, countdown: float, headers: dict[str, Any]) -> NoReturn:
        """This message again, same id and same ``retries`` (nothing failed), ``headers`` added; then end."""
        request = self.request
        signature = self.signature_from_request(request, countdown=countdown, retries=request.retries)
        signature.options["headers"] = {**(signature.options.get("headers") or {}), **headers}
        signature.apply_async()
        raise Ignore()

    def _strand(self, key: str, run_info: codec.Encoded, detail: str) -> None:
        """The record ``celery fence leases`` shows for a run that gave up waiting out the store. The store
        is probably still down: the process's runtime keeps it owed until it can be written. Eager runs
        (``apply()``) raise to their caller instead."""
        request = self.request
        if request.is_eager:
            return
        reason = f"{self.name}[{request.id}] gave up waiting out the unavailable store ({detail})"
        runtime = runtime_for(self.app)
        runtime.owed.write(runtime.store, Stranded(request.id, key, run_info, reason))

    def superseded(self, fence: Fence, state: LeaseState | None) -> NoReturn:
        """A run of another task id took the key over and has not finished it: this task id ends FAILURE
        naming it (DESIGN.md §3), instead of waiting for ever."""
        owner = None if state is None else state.owner
        task_id = None if state is None or not state.run else state.run.get("id")
        holder = f"{owner} (task {task_id})" if task_id else owner
        raise LeaseHeld(fence.key, holder, None if state is None else state.expires_in)

    def _store_failure(self, exc: FenceError) -> None:
        if self.request.is_eager:
            return
        try:
            self.backend.mark_as_failure(self.request.id, exc, request=self.request)
        except Exception as error:  # no result backend, or it is down: nothing more to tell
            log.warning("fence: could not store the outcome of %s: %s", self.request.id, error)

    def _run_info(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> codec.Encoded:
        return run_info(self, self.request, args, kwargs)  # what recovery needs to send this run again
