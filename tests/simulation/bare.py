"""The same programs without Celery's tracer: ``Run`` through a fake host.

:class:`BareWorker` runs a message as the task's ``__call__`` and Celery's tracer would, in a few lines:
the message's request (Celery's plain ``Context``), ``Run`` with a :class:`BareHost`, the ending carried out
by the library's own ``_perform``, and what the tracer then does with the outcome (``SUCCESS`` and the link,
``RETRY``, ``FAILURE`` and the errback, nothing for ``Ignore`` and ``Reject``). Copies go straight to the
program's queue. It is the cheap path of the simulation: the Celery glue (``FencedTask.__call__``, the
tracer, signatures, the broker's headers) is covered by the programs that run through the tracer
(``broker.py``), and the checks are the same.
"""

from __future__ import annotations

import json
from typing import Any

from celery.app.task import Context
from celery.exceptions import Ignore, MaxRetriesExceededError, Reject, Retry

from celery_fence import _delivery
from celery_fence.run import Run
from celery_fence.task import _perform

from .broker import Message

__all__ = ["BareWorker"]


class BareTask:
    """What the body and ``_perform`` use of the task: ``fence``, ``request``, ``retry``, sending a copy."""

    name = "sim.work"

    def __init__(self, worker: BareWorker, request: Context, message: Message) -> None:
        self.worker, self.request, self.message = worker, request, message
        self.app = worker.sim.app
        self.backend = self.app.backend

    @property
    def fence(self) -> Any:
        return self.request._fence

    @property
    def max_retries(self) -> int | None:
        return self.worker.sim.work.max_retries  # type: ignore[no-any-return]

    def retry(self, countdown: float = 0.0) -> Retry:
        """As ``Task.retry``: no retries left raises; otherwise the copy is sent with ``retries + 1``."""
        retries = self.request.retries or 0
        if self.max_retries is not None and retries >= self.max_retries:
            raise MaxRetriesExceededError(f"sim: {self.name}[{self.request.id}] has no retries left")
        self.signature_from_request(self.request, countdown=countdown, retries=retries + 1).apply_async()
        raise Retry(when=countdown)

    def signature_from_request(self, request: Any, countdown: float, retries: int) -> _Copy:
        """As ``FencedTask.signature_from_request``: the lineage headers and the hand-off token."""
        headers = _delivery.lineage({k: v for k, v in self.message.headers.items() if k.startswith("fence_")})
        fence = request._fence  # fence_mode="commit" holds no lease to hand to the copy
        if fence is not None and getattr(fence, "commit_mode", None) is None:
            headers[_delivery.HANDOFF] = fence.token
        return _Copy(self, countdown, retries, headers)


class _Copy:
    """A signature of the message again: ``options["headers"]`` is what ``_perform`` adds to."""

    def __init__(self, task: BareTask, countdown: float, retries: int, headers: dict[str, Any]) -> None:
        self.task, self.countdown, self.retries = task, countdown, retries
        self.options: dict[str, Any] = {"headers": headers}

    def apply_async(self) -> None:
        original, worker = self.task.message, self.task.worker
        kept = {k: v for k, v in original.headers.items() if not k.startswith("fence_")}
        headers = {**kept, **self.options["headers"], "retries": self.retries}
        worker.sim.broker._serial += 1
        due = worker.sim.clock() + float(self.countdown or 0.0)
        copy = Message(original.name, headers, original.body, original.content_type, original.encoding, due,
                       serial=worker.sim.broker._serial, extra=original.extra)
        worker.world().sent(copy)


class BareHost:
    """The run's host (``RunHost``) in the bare worker: the body, the result backend's word, the reports."""

    def __init__(self, task: BareTask) -> None:
        self.task = task

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.task.worker.world().body(self.task, *args, **kwargs)

    def outcome(self) -> str | None:
        return str(self.task.backend.get_task_meta(self.task.request.id).get("status"))

    def acquired(self, fence: Any) -> None:
        self.task.request._fence = fence

    def released(self, fence: Any) -> None:
        from .sim import late_interrupt  # the run's last step, as in the Celery programs

        self.task.request._fence = None
        late_interrupt(self.task.worker.world())

    def report(self, what: str, key: str, token: int, **fields: Any) -> None:
        if what == "gave up":  # as the store_wait_exhausted signal tells the simulator
            self.task.worker.sim._gave_up(task_id=self.task.request.id, waited=fields["waited"])


class BareWorker:
    def __init__(self, sim: Any) -> None:
        self.sim = sim

    def world(self) -> Any:
        return self.sim._world()

    def deliver(self, message: Message) -> tuple[int, Any]:
        """Run ``message``; returns ``(failed, result)`` as the tracer does."""
        args, kwargs, embed = json.loads(message.body)
        request = Context(
            dict(message.headers), args=args, kwargs=kwargs, is_eager=False, called_directly=False,
            delivery_info={"exchange": "", "routing_key": "celery", "redelivered": message.redelivered},
            callbacks=embed.get("callbacks"), errbacks=embed.get("errbacks"), _fence=None,
        )
        task = BareTask(self, request, message)
        runtime = self.sim.runtime
        attempt = _delivery.attempt_of(request, task.name)
        info = _delivery.run_info(self.sim.work, request, tuple(args), kwargs)
        run = Run(BareHost(task), runtime, runtime.config, f"sim:{args[0]}", info, attempt)
        backend, task_id = task.backend, request.id
        try:
            value = _perform(task, request, runtime, run.execute(tuple(args), kwargs))  # type: ignore[arg-type]
        except Retry as exc:
            backend.mark_as_retry(task_id, exc.exc, request=request)
            return 1, exc
        except (Ignore, Reject) as exc:
            return 1, exc
        except Exception as exc:  # stored with the request, as the tracer does: the backend sends the errback
            backend.mark_as_failure(task_id, exc, request=request)
            return 1, exc
        if request.callbacks:  # sent before the result is stored, as the tracer does
            self.world().rec.links[task_id] += 1
        backend.mark_as_done(task_id, value)
        return 0, value

