"""``FencedTask``: a Celery task whose every run holds a lease and whose writes carry its fencing token.

The lifecycle (docs/architecture.md#the-path-of-one-run) brackets the body inside ``__call__``, the one place
Celery runs both in a worker and in eager ``apply()``, and before the result is stored:

1. acquire the key's lease (a finished key returns its stored result unrun; a held one goes to
   ``fence_on_busy``, or is absorbed when the holder is a copy of this very task id);
2. the process's renewer keeps the lease alive while the body runs;
3. the return value is completed with the token; a refused run (``StaleToken``/``LeaseLost``) stores
   nothing in the result backend: it ends with ``Ignore`` when a newer holder exists, or is sent again
   (same id) when the lease only lapsed, so the work is never dropped;
4. an exception or ``self.retry()`` releases the lease so the next attempt acquires at once.

All of that is decided by :class:`~celery_fence.run.Run`, which returns an ending; this module only maps
Celery to the run (:class:`_Host`) and the ending back to Celery (:func:`_perform`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from celery import Task
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, Retry
from celery.signals import celeryd_after_setup, celeryd_init, worker_process_shutdown, worker_shutdown

from . import _delivery
from ._delivery import Ending, Kind
from ._events import send_fence_event
from ._runtime import FenceRuntime, runtime_for
from .errors import FenceError
from .fence import Fence
from .run import Run, quietly
from .signals import (
    lease_acquired,
    lease_duplicate,
    lease_lost,
    lease_released,
    lease_renewed,
    lease_takeover,
    run_ended,
    store_wait_exhausted,
    write_refused,
)
from .worker.bootstep import add_worker_steps, settle_owed_records
from .worker.startup import check_worker_at_start

__all__ = ["FencedTask"]

log = logging.getLogger(__name__)

# run_ended's word for an ending the run reported nothing about (a refusal, a duplicate say so themselves).
_ENDED = {
    Kind.RETURN: "completed", Kind.SEND_AGAIN: "requeued", Kind.RAISE: "raised", Kind.IGNORE: "ignored"
}


class FencedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Base class for fenced tasks: ``@app.task(base=FencedTask, bind=True, fence_key="order:{order_id}")``.

    Task options (each overrides the app's ``fence_*`` setting of the same name for this task):
    ``fence_key`` (format string over the arguments, or callable; default: the task id),
    ``fence_lease_ttl``, ``fence_on_busy`` (``"retry"``, ``"ignore"``, ``"fail"``), ``fence_interrupt``,
    ``fence_mode`` (``"lease"``, the default, or ``"commit"``: a fenced commit, docs/commit-mode.md).
    """

    Request = "celery_fence.worker.request:FencedRequest"  # releases the lease of a pool process that died
    fence_key: ClassVar[str | Callable[..., str] | None] = None
    fence_lease_ttl: ClassVar[float | None] = None
    fence_on_busy: ClassVar[str | None] = None
    fence_interrupt: ClassVar[bool | None] = None
    fence_mode: ClassVar[str | None] = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Hook the worker's start (its steps, the settings check) and the end of its processes (records they
        owe the store), once per process whatever the number of tasks."""
        celeryd_init.connect(add_worker_steps, weak=False, dispatch_uid="celery_fence.worker_steps")
        check = partial(check_worker_at_start, fenced=FencedTask)  # the worker package never imports this one
        celeryd_after_setup.connect(check, weak=False, dispatch_uid="celery_fence.startup")
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
        options = (self.fence_lease_ttl, self.fence_on_busy, self.fence_interrupt, self.fence_mode)
        config = runtime.config_for(self.name, options)
        key, _ = _delivery.derive_key(self, args, kwargs)
        info = _delivery.run_info(self, request, args, kwargs)  # what recovery needs to send this run again
        attempt = _delivery.attempt_of(request, self.name)
        host = _Host(self, request, runtime)
        ending = Run(host, runtime, config, key, info, attempt).execute(args, kwargs)
        said = host.said or ("gave_up" if ending.record is not None else _ENDED[ending.kind])
        run_ended.send(sender=self, key=key, task_id=request.id, ending=said)
        return _perform(self, request, runtime, ending)

    def signature_from_request(self, request: Any = None, *args: Any, **options: Any) -> Any:
        """Every copy sent of this message (``retry``, the fence's own) carries the lineage headers, never
        the attempt's (a wait's clock), and names the token it hands over, so the copy can take the key
        back at once if this attempt's release does not reach the store."""
        signature = super().signature_from_request(request, *args, **options)
        sent = _delivery.lineage(signature.options.get("headers"))
        request = request if request is not None else self.request
        fence = getattr(request, "_fence", None)
        if fence is not None and fence.commit_mode is None:  # fence_mode="commit" holds no lease to hand
            sent[_delivery.HANDOFF] = fence.token
        # A copy has its message's parent: Celery would name the task sending it (this very task id) as
        # the parent of a top-level task's copy, and monitors then list it as its own parent and child.
        # A header of the send overrides the one Celery computes.
        sent["parent_id"] = request.parent_id
        signature.options["headers"] = sent
        return signature


class _Host:
    """What a run asks of its Celery task (:class:`~celery_fence.run.RunHost`), for one request: the
    request is captured, since the renewer's thread reports too."""

    def __init__(self, task: FencedTask, request: Any, runtime: FenceRuntime) -> None:
        self.task, self.request, self.runtime = task, request, runtime
        self.started = time.monotonic()
        self.said: str | None = None  # "refused" or "duplicate" once reported: how the run ended

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.task.run(*args, **kwargs)

    def outcome(self) -> str | None:
        """This task id's state in the result backend (``SUCCESS`` means the run that stored it also sent
        its callbacks). ``None``: nothing can tell (eager ``apply()``, no result backend)."""
        task, request = self.task, self.request
        if request.is_eager or isinstance(task.backend, DisabledBackend):
            return None
        try:
            return str(task.backend.get_task_meta(request.id).get("status"))
        except Exception as exc:  # a backend that cannot answer: as if nothing ended yet (at least once)
            log.warning("fence: could not read the result of %s: %s", request.id, exc)
            return "UNKNOWN"

    def acquired(self, fence: Fence) -> None:
        """The lease is held: expose it as ``self.fence`` and tell the world."""
        task, request = self.task, self.request
        request._fence = fence
        self.started = time.monotonic()
        fields = {"key": fence.key, "token": fence.token, "task_id": request.id}
        lease_acquired.send(sender=task, **fields)
        if fence.lease.taken_over:  # the store said so in the acquire itself: no extra round trip
            expired_for = fence.lease.expired_for
            lease_takeover.send(sender=task, expired_for=expired_for, **fields)
            # Only an exceptional acquire is published: an event per run cost a seventh of the throughput.
            event = {"key": fence.key, "token": fence.token, "expired_for": expired_for}
            self._event("takeover", **event)

    def released(self, fence: Fence) -> None:
        self.request._fence = None
        held = time.monotonic() - self.started
        lease_released.send(
            sender=self.task, held=held, key=fence.key, token=fence.token, task_id=self.request.id
        )

    def report(self, what: str, key: str, token: int, **fields: Any) -> None:
        task, request = self.task, self.request
        run = {"key": key, "token": token, "task_id": request.id}
        if what == "renewed":
            lease_renewed.send(sender=task, **run)
        elif what == "lost":
            reason = fields["reason"]
            log.warning("fence lease lost: %s token %d (%s): %s", key, token, task.name, reason)
            lease_lost.send(sender=task, reason=reason, **run)
            self._event("lost", key=key, token=token, reason=reason)
        elif what == "refused":
            reason = fields["reason"]
            log.warning("fence refused %s[%s]: %s", task.name, request.id, reason)
            self.said = what
            write_refused.send(sender=task, reason=reason, **run)
            self._event("refused", key=key, token=token, exception=reason)
        elif what == "duplicate":
            reason = fields["reason"]
            detail = fields.get("detail", reason)
            why = _absorbed_because(reason, token, detail)
            log.info("fence: duplicate delivery of %s absorbed: %s", key, why)
            self.said = what
            self._event("duplicate", key=key, token=token, reason=detail)
            lease_duplicate.send(sender=task, reason=reason, **run)
        else:
            assert what == "gave up", what
            store_wait_exhausted.send(sender=task, key=key, task_id=request.id, waited=fields["waited"])

    def _event(self, kind: str, **fields: Any) -> None:
        send_fence_event(self.runtime.config, self.task, self.request, kind, **fields)


def _absorbed_because(reason: str, token: int, detail: str | None = None) -> str:
    """What the log says of an absorbed delivery: the reason word (``done``, ``held``, ``ended``), then what
    happened in words. A token is named only when the key has one to name: an absorbed delivery that never
    acquired has none (it was reported as 0)."""
    if reason == "done":
        return f"done (the key finished with token {token})" if token else "done (the key is finished)"
    if reason == "ended":
        return "ended (this task id already ended: this late copy does not run)"
    if detail and detail != reason:  # fence_on_busy="ignore": who holds the key
        return f"{reason} ({detail}; fence_on_busy='ignore')"
    return f"{reason} (a copy of this task id holds the key: this delivery looks at it again later)"


def _perform(task: FencedTask, request: Any, runtime: FenceRuntime, ending: Ending) -> Any:
    """Carry ``ending`` out in Celery's terms: send the copy, give its lease back, write the owed record,
    store the FAILURE the caller must see; then return the value or raise."""
    if ending.kind is Kind.SEND_AGAIN:
        signature = task.signature_from_request(request, countdown=ending.countdown, retries=request.retries)
        headers = {**signature.options["headers"], **ending.headers}
        if ending.hand_back is not None:  # the copy takes it back at once if the release below fails
            headers[_delivery.HANDOFF] = ending.hand_back.token
        signature.options["headers"] = headers
        signature.apply_async()
    if ending.hand_back is not None:  # after the send: the copy may start at once
        quietly(runtime.store.release, ending.hand_back)
    if ending.record is not None:
        runtime.owed.write(runtime.store, ending.record)
    if ending.failure is not None and not request.is_eager:
        _store_failure(task, request, ending.failure)
    if ending.kind is Kind.RETURN:
        return ending.value
    if ending.kind is Kind.RAISE:
        assert ending.error is not None
        raise ending.error
    if ending.kind is Kind.SEND_AGAIN and ending.error is not None:  # shown as RETRY, no retry spent
        raise Retry(exc=ending.error, when=ending.countdown)
    raise Ignore()


def _store_failure(task: FencedTask, request: Any, exc: FenceError) -> None:
    try:
        task.backend.mark_as_failure(request.id, exc, request=request)
    except Exception as error:  # no result backend, or it is down: nothing more to tell
        log.warning("fence: could not store the outcome of %s: %s", request.id, error)
