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
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore
from celery.signals import celeryd_after_setup, celeryd_init

from . import codec
from .bootstep import add_worker_steps
from .config import FenceConfig
from .errors import (
    AlreadyDone,
    FenceError,
    LeaseHeld,
    LeaseLost,
    StaleToken,
    StoreUnavailable,
)
from .events import send_fence_event
from .failpoints import failpoint
from .fence import Fence
from .keys import derive_key
from .lease import Lease
from .runinfo import run_info
from .runtime import FenceRuntime, runtime_for
from .signals import (
    lease_acquired,
    lease_duplicate,
    lease_lost,
    lease_released,
    lease_renewed,
    lease_takeover,
    write_refused,
)
from .startup import check_worker_at_start

__all__ = ["FencedTask"]

log = logging.getLogger(__name__)

ACQUIRE_ATTEMPTS = 3


class FencedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Base class for fenced tasks: ``@app.task(base=FencedTask, bind=True, fence_key="order:{order_id}")``.

    Task options (each overrides the app's ``fence_*`` setting of the same name for this task):
    ``fence_key`` (format string over the arguments, or callable; default: the task id),
    ``fence_lease_ttl``, ``fence_on_busy`` (``"retry"``, ``"ignore"``, ``"fail"``), ``fence_interrupt``.
    """

    Request = "celery_fence.request:FencedRequest"  # releases the lease of a pool process that died
    fence_key: ClassVar[str | Callable[..., str] | None] = None
    fence_lease_ttl: ClassVar[float | None] = None
    fence_on_busy: ClassVar[str | None] = None
    fence_interrupt: ClassVar[bool | None] = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Check the app's settings when a worker starts (once per process, whatever the number of tasks)."""
        celeryd_init.connect(add_worker_steps, weak=False, dispatch_uid="celery_fence.worker_steps")
        celeryd_after_setup.connect(check_worker_at_start, weak=False, dispatch_uid="celery_fence.startup")

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
        key, is_task_id = derive_key(self, args, kwargs)
        try:
            lease, sent_at = self._acquire(runtime, config, key, self._run_info(args, kwargs))
        except AlreadyDone as done:
            log.info("fence: duplicate delivery of %s absorbed: already done (token %d)", key, done.token)
            send_fence_event(
                self, self.request, "duplicate", key=key, token=done.token, reason="already done"
            )
            lease_duplicate.send(sender=self, key=key, token=done.token, task_id=request.id, reason="done")
            return done.result
        except LeaseHeld as held:
            return self._on_busy(held, config, is_task_id)
        except StoreUnavailable as exc:  # nothing started and no lease held: Celery may simply retry
            log.warning("fence: store unavailable for %s, retrying the task: %s", key, exc)
            return self.retry(exc=exc, countdown=config.policy.interval)
        return self._run_fenced(runtime, config, lease, sent_at, args, kwargs)

    def _acquire(
        self, runtime: FenceRuntime, config: FenceConfig, key: str, run: codec.Encoded
    ) -> tuple[Lease, float]:
        """Acquire, retrying a store hiccup a few times with the same owner: an acquire that committed but
        whose answer was lost is then found again (a store returns its own owner's live lease)."""
        owner = runtime.new_owner()
        failpoint("before-acquire")
        for attempt in range(ACQUIRE_ATTEMPTS):
            sent_at = time.monotonic()
            try:
                lease = runtime.store.acquire(key, owner, config.policy.ttl, run)
                failpoint("after-acquire")
                return lease, sent_at
            except StoreUnavailable:
                if attempt == ACQUIRE_ATTEMPTS - 1:
                    raise
                time.sleep(min(0.5, config.policy.interval / 4) * (attempt + 1))
        raise AssertionError("unreachable")

    def _run_fenced(
        self,
        runtime: FenceRuntime,
        config: FenceConfig,
        lease: Lease,
        sent_at: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        fence = Fence(runtime.store, lease, lambda: runtime.renewer.deadline(lease))
        request = self.request  # the renewer's thread has no request of its own
        request._fence = fence
        fields = {"key": lease.key, "token": lease.token, "task_id": request.id}
        lease_acquired.send(sender=self, **fields)
        if lease.taken_over:  # the store said so in the acquire itself: no extra round trip
            lease_takeover.send(sender=self, expired_for=lease.expired_for, **fields)
        if runtime.task_events:  # sent only when the worker sends task events
            send_fence_event(self, request, "acquired", key=lease.key, token=lease.token)
        interrupt = runtime.interrupter.arm(fence) if config.interrupt else None

        def on_lost(lost: Lease, reason: str) -> None:
            fence.mark_lost(reason)
            log.warning("fence lease lost: %s token %d (%s): %s", lost.key, lost.token, self.name, reason)
            lease_lost.send(sender=self, reason=reason, **fields)
            send_fence_event(self, request, "lost", key=lost.key, token=lost.token, reason=reason)
            if interrupt is not None:
                runtime.interrupter.fire(interrupt, fence)

        runtime.renewer.track(
            lease, config.policy, sent_at, on_lost, lambda _: lease_renewed.send(sender=self, **fields)
        )
        try:
            try:
                result = self.run(*args, **kwargs)
            finally:
                if interrupt is not None:
                    runtime.interrupter.disarm(interrupt)
            self._complete(runtime, config, fence, result)
            return result
        except (LeaseLost, StaleToken) as exc:
            self._refused(runtime, fence, exc)
        except StoreUnavailable as exc:  # a fenced write's outcome is unknown: run again once it answers
            log.warning("fence: store unavailable in %s[%s], re-queued: %s", self.name, self.request.id, exc)
            if self.request.is_eager:
                self._release(runtime, lease)
                raise
            self._requeue(countdown=config.policy.interval, handing_back=(runtime, lease))
        except BaseException:
            self._release(runtime, lease)
            raise
        finally:
            runtime.renewer.untrack(lease)
            self.request._fence = None
            lease_released.send(sender=self, held=time.monotonic() - sent_at, **fields)

    def _complete(self, runtime: FenceRuntime, config: FenceConfig, fence: Fence, result: Any) -> None:
        """Complete with the token; retry a store hiccup until the local deadline."""
        deadline = time.monotonic() + config.policy.ttl - config.policy.margin
        failpoint("before-complete")
        while True:
            try:
                runtime.store.complete(fence.lease, result)
                return
            except StaleToken:
                state = runtime.store.get(fence.key)
                if state is not None and state.done and state.token == fence.token:
                    return  # our own completion committed; only its reply was lost
                raise
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    raise LeaseLost(
                        fence.key, fence.token, "completion unconfirmed before the deadline"
                    ) from None
                time.sleep(min(1.0, config.policy.interval / 4))

    def _refused(self, runtime: FenceRuntime, fence: Fence, exc: LeaseLost | StaleToken) -> None:
        reason = str(exc)
        if isinstance(exc, LeaseLost):  # refused here, before the store saw a write
            self._quietly(runtime.store.refuse, fence.lease, f"lease lost: {exc.reason}")
        elif not exc.recorded:  # refused by the resource itself (fenced_update): put it in the history too
            self._quietly(runtime.store.refuse, fence.lease, exc.what)
        log.warning("fence refused %s[%s]: %s", self.name, self.request.id, reason)
        write_refused.send(
            sender=self, key=fence.key, token=fence.token, task_id=self.request.id, reason=reason
        )
        send_fence_event(self, self.request, "refused", key=fence.key, token=fence.token, exception=reason)
        state = self._quietly(runtime.store.get, fence.key)
        if state is not None and (state.token != fence.token or state.done):
            raise Ignore()  # a newer holder owns the key (or finished it): nothing is ours to store
        if self.request.is_eager:  # apply() has no queue to go back to: the caller sees why
            self._release(runtime, fence.lease)
            raise exc
        self._requeue(countdown=0, handing_back=(runtime, fence.lease))  # only lapsed: run again

    def _on_busy(self, held: LeaseHeld, config: FenceConfig, is_task_id: bool) -> Any:
        countdown = config.policy.busy_countdown(held.expires_in)
        if is_task_id or config.on_busy == "ignore":  # both are told as task-fence-duplicate below
            lease_duplicate.send(sender=self, key=held.key, token=0, task_id=self.request.id, reason="held")
        if is_task_id:  # a copy of this very task id: absorb it, and come back in case the holder dies
            log.info("fence: duplicate delivery of %s absorbed: %s; back in %.1fs", held.key, held, countdown)
            send_fence_event(self, self.request, "duplicate", key=held.key, token=0, reason=str(held))
            self._requeue(countdown)
        if config.on_busy == "ignore":
            send_fence_event(self, self.request, "duplicate", key=held.key, token=0, reason=str(held))
            raise Ignore()
        if config.on_busy == "fail":
            raise held
        return self.retry(exc=held, countdown=countdown)

    def _requeue(self, countdown: float, handing_back: tuple[FenceRuntime, Lease] | None = None) -> None:
        """Send this message again (same id) without touching the result backend, then end with Ignore.

        A lease handed back is released only once the message is sent again: if it cannot be (max_retries),
        the lease stays to expire, so ``fence recover`` finds the run abandoned instead of losing it.
        """
        request = self.request
        if self.max_retries is not None and request.retries >= self.max_retries:
            log.error(
                "fence: %s[%s] not re-queued: max_retries reached; recovery will find it once its "
                "lease expires",
                self.name,
                request.id,
            )
            raise Ignore()
        if request.is_eager:
            raise Ignore()
        self.signature_from_request(request, countdown=countdown, retries=request.retries + 1).apply_async()
        if handing_back is not None:
            self._release(*handing_back)  # the copy just sent may start at once
        raise Ignore()

    def _release(self, runtime: FenceRuntime, lease: Lease) -> None:
        self._quietly(runtime.store.release, lease)

    def _quietly(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Best-effort store calls on the way out: a failure leaves the lease to expire by its ttl."""
        try:
            return fn(*args)
        except FenceError as exc:
            log.warning("fence: %s on %s failed: %s", getattr(fn, "__name__", fn), self.name, exc)
            return None

    def _run_info(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> codec.Encoded:
        return run_info(self, self.request, args, kwargs)  # what recovery needs to send this run again
