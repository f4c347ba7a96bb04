"""DataParallel from the inside: the nine steps of one training step on K virtual devices, traced.

torch.nn.DataParallel (数据并行) is single-process, multi-thread (单进程多线程): one process owns the
weights on the main device (主 GPU) and, every step, scatters the batch, replicates the model, runs one
thread per device and collects the results back. :class:`ThreadedDataParallel` does the same on the CPU
with K *virtual* devices (a thread and its own copy of every tensor each) and records every step in a
:class:`Trace`: what moved, how many bytes, how long it took, in which thread.
"""

from __future__ import annotations

import copy
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from helpers.bytecount import nbytes
from helpers.errors import CourseError
from helpers.toys import mlp

STEPS = (
    "scatter inputs",
    "replicate model",
    "parallel forward",
    "gather outputs",
    "loss on main",
    "loss gradient",
    "parallel backward",
    "reduce gradients",
    "update",
)
MAIN = 0  # the main device (主 GPU): index 0, like device_ids[0]
STEP_COLORS = dict(
    zip(
        STEPS,
        ["#4C72B0", "#8172B3", "#55A868", "#DD8452", "#C44E52", "#DA8BC3", "#8C8C8C", "#937860", "#17BECF"],
        strict=True,
    )
)


# --- the model and the data -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A multi-layer perceptron: inputs -> depth x (Linear, ReLU) of ``width`` -> classes."""

    inputs: int = 256
    width: int = 1024
    depth: int = 2
    classes: int = 1000

    def args(self) -> list[str]:
        """The same spec as command-line flags for a launched script."""
        return [f"--{name}={getattr(self, name)}" for name in ("inputs", "width", "depth", "classes")]


def make_model(spec: ModelSpec, seed: int = 0) -> nn.Sequential:
    """A freshly initialised model of ``spec``; the same ``seed`` gives the same weights in every process."""
    return mlp([spec.inputs] + [spec.width] * spec.depth + [spec.classes], seed=seed)


def make_batch(spec: ModelSpec, batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch (inputs, class labels); the same ``seed`` gives the same batch everywhere."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, spec.inputs, generator=generator)
    y = torch.randint(0, spec.classes, (batch,), generator=generator)
    return x, y


def make_optimizer(model: nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    """The course's optimizer for this lesson: SGD with momentum (its state lives with the weights)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def check_batch(batch: int, k_max: int, nproc: int) -> None:
    """Stop unless the global batch splits into K_MAX slices and into equal DDP shards."""
    if batch < k_max:
        raise CourseError(
            f"BATCH = {batch} cannot be split over K_MAX = {k_max} devices; use at least {k_max}."
        )
    if batch % nproc:
        raise CourseError(
            f"BATCH = {batch} does not split evenly over {nproc} DDP processes; use a multiple of {nproc}."
        )


# --- the trace --------------------------------------------------------------------------------------


@dataclass
class Event:
    """One traced piece of work: which step, on which virtual device, what moved and for how long."""

    step: str
    device: int  # the lane: the virtual device whose thread did the work
    what: str
    nbytes: int  # bytes copied between devices (0 for compute)
    start: float  # perf_counter seconds
    end: float
    cpu: float  # CPU seconds the working thread itself used (time.thread_time)
    thread: str
    src: int | None = None  # for a copy: from which device ...
    dst: int | None = None  # ... to which device

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Trace:
    """Everything one step did, event by event, plus the bytes each device held at its end."""

    k: int
    events: list[Event] = field(default_factory=list)
    held: list[dict] = field(default_factory=list)  # per device: {data_ptr: bytes} of live tensors
    loss: float = float("nan")
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        self.held = [{} for _ in range(self.k)]

    @contextmanager
    def record(self, step: str, device: int, what: str, nbytes: int = 0, src=None, dst=None):
        """Time the body (wall and this thread's CPU) and keep it as one :class:`Event`."""
        assert step in STEPS, step
        cpu0, start = time.thread_time(), time.perf_counter()
        yield
        end, cpu1 = time.perf_counter(), time.thread_time()
        event = Event(
            step, device, what, nbytes, start, end, cpu1 - cpu0, threading.current_thread().name, src, dst
        )
        with self._lock:
            self.events.append(event)

    def hold(self, device: int, *tensors) -> None:
        """Note tensors that live on ``device`` (views of one storage count once)."""
        for t in tensors:
            if isinstance(t, (list, tuple)):
                self.hold(device, *t)
            elif t is not None:
                storage = t.untyped_storage()
                self.held[device][storage.data_ptr()] = storage.nbytes()

    # what the trace says, per device

    def step_names(self) -> list[str]:
        """The steps in the order they first happened."""
        return list(dict.fromkeys(e.step for e in sorted(self.events, key=lambda e: e.start)))

    def wall(self) -> float:
        """Seconds from the first event's start to the last one's end."""
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def busy(self) -> list[float]:
        """Per device: wall seconds of the events in its lane (waiting for the GIL or a core included)."""
        return [sum(e.seconds for e in self.events if e.device == d) for d in range(self.k)]

    def cpu(self) -> list[float]:
        """Per device: CPU seconds its threads actually used for its events (waiting excluded)."""
        return [sum(e.cpu for e in self.events if e.device == d) for d in range(self.k)]

    def moved(self) -> list[int]:
        """Per device: bytes it sent plus bytes it received."""
        out = [0] * self.k
        for e in self.events:
            if e.nbytes and e.src != e.dst:
                out[e.src] += e.nbytes
                out[e.dst] += e.nbytes
        return out

    def held_bytes(self) -> list[int]:
        """Per device: bytes of the tensors it held when the step ended (activations not counted)."""
        return [sum(h.values()) for h in self.held]

    def spans(self) -> list[dict]:
        """The events in the form :func:`helpers.plots.timeline` draws."""
        return [
            {"lane": device_name(e.device), "start": e.start, "end": e.end, "label": e.step}
            for e in sorted(self.events, key=lambda e: e.start)
        ]

    def rows(self) -> list[dict]:
        """One row per event, in time order, for a table."""
        origin = min(e.start for e in self.events)
        return [
            {
                "step": f"{STEPS.index(e.step) + 1}. {e.step}",
                "device": device_name(e.device),
                "thread": e.thread,
                "what": e.what,
                "bytes": e.nbytes,
                "start ms": round((e.start - origin) * 1e3, 2),
                "ms": round(e.seconds * 1e3, 3),
            }
            for e in sorted(self.events, key=lambda e: e.start)
        ]

    def per_step(self) -> list[dict]:
        """Per step: bytes moved and milliseconds, for the main device and for the others together."""
        rows = []
        for step in STEPS:
            mine = [e for e in self.events if e.step == step]
            rows.append(
                {
                    "step": f"{STEPS.index(step) + 1}. {step}",
                    "events": len(mine),
                    "bytes moved": sum(e.nbytes for e in mine),
                    "ms on main": round(sum(e.seconds for e in mine if e.device == MAIN) * 1e3, 3),
                    "ms on others": round(sum(e.seconds for e in mine if e.device != MAIN) * 1e3, 3),
                }
            )
        return rows


def device_name(d: int) -> str:
    return f"dev{d} (main)" if d == MAIN else f"dev{d}"


# --- the hand-written DataParallel ---------------------------------------------------------------------


def run_in_threads(k: int, work) -> None:
    """Run ``work(d)`` for d = 0..k-1, one thread per device (inline when k = 1, as torch does).

    Each thread starts in the caller's grad mode (grad mode is per thread); the first error raised
    in a thread is raised again here, in the caller's thread.
    """
    if k == 1:
        work(0)
        return
    grad_enabled = torch.is_grad_enabled()
    errors: list[BaseException | None] = [None] * k

    def run(d):
        try:
            with torch.set_grad_enabled(grad_enabled):
                work(d)
        except BaseException as exc:  # handed back to the calling thread below
            errors[d] = exc

    threads = [threading.Thread(target=run, args=(d,), name=f"worker-dev{d}") for d in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc


class ThreadedDataParallel:
    """A hand-written torch.nn.DataParallel for the CPU: K virtual devices, one thread each.

    ``model`` holds the master weights on the main device; :meth:`step` runs one training step in the
    nine steps of :data:`STEPS` and returns its :class:`Trace`.
    """

    def __init__(self, model: nn.Module, k: int, lr: float = 0.05):
        if k < 1:
            raise CourseError(f"k = {k} virtual devices is not possible; use 1 or more.")
        self.model, self.k = model, k
        # replica 0 *is* the main model (like torch's replicate, which hands device_ids[0] the
        # original tensors); the others are separate copies, refreshed with the main weights each step
        self.replicas = [model] + [copy.deepcopy(model) for _ in range(k - 1)]
        self.optimizer = make_optimizer(model, lr)  # its state (momentum) exists on the main device only

    def step(self, x: torch.Tensor, y: torch.Tensor) -> Trace:
        """One training step on the global batch ``(x, y)``, following the original tutorial's nine steps."""
        k, trace = self.k, Trace(self.k)
        if len(x) < k:
            raise CourseError(f"a batch of {len(x)} rows cannot be split over {k} devices; use at least {k}.")
        weights = list(self.model.parameters())
        self.optimizer.zero_grad(set_to_none=True)
        for replica in self.replicas[1:]:
            replica.zero_grad(set_to_none=True)

        # 1. scatter inputs: the main device sends each device its slice of the batch. Like torch's scatter it
        # slices with Tensor.chunk, which may make fewer than k slices: the devices past them sit this step out
        chunks = []
        for d, part in enumerate(x.chunk(k)):
            sent = nbytes(part) if d != MAIN else 0  # the main device's slice stays where it is
            with trace.record("scatter inputs", MAIN, f"x[{len(part)} rows] -> dev{d}", sent, MAIN, d):
                chunks.append(part if d == MAIN else part.clone())

        used = len(chunks)  # torch replicates to device_ids[:len(inputs)] only

        # 2. replicate model: the main device's current weights are copied to every other device that got a slice
        with trace.record("replicate model", MAIN, "dev0 runs on the main weights themselves", 0, MAIN, MAIN):
            pass
        for d in range(1, used):
            with trace.record("replicate model", MAIN, f"weights -> dev{d}", nbytes(weights), MAIN, d):
                with torch.no_grad():
                    for mine, main in zip(self.replicas[d].parameters(), weights, strict=True):
                        mine.copy_(main)

        # 3. parallel forward: one thread per device, each on its own replica and slice
        outputs: list[torch.Tensor | None] = [None] * used

        def forward(d):
            with trace.record("parallel forward", d, f"forward of {len(chunks[d])} rows"):
                outputs[d] = self.replicas[d](chunks[d])

        run_in_threads(used, forward)

        # 4. gather outputs: every device's outputs are copied to the main device and joined
        pieces = []
        for d in range(used):
            sent = nbytes(outputs[d]) if d != MAIN else 0
            with trace.record("gather outputs", MAIN, f"outputs dev{d} -> dev0", sent, d, MAIN):
                pieces.append(outputs[d].detach() if d == MAIN else outputs[d].detach().clone())
        with trace.record("gather outputs", MAIN, "concatenate on dev0"):
            gathered = torch.cat(pieces).requires_grad_()

        # 5. loss on the main device, over the whole global batch
        with trace.record("loss on main", MAIN, "cross-entropy of the whole batch"):
            loss = F.cross_entropy(gathered, y)

        # 6. loss gradient: d loss / d outputs on the main device, then sent back to each device
        with trace.record("loss gradient", MAIN, "d loss / d outputs on dev0"):
            (grad_outputs,) = torch.autograd.grad(loss, gathered)
        grad_chunks = []
        for d, part in enumerate(grad_outputs.split([len(c) for c in chunks])):
            sent = nbytes(part) if d != MAIN else 0
            with trace.record("loss gradient", MAIN, f"d loss/d outputs -> dev{d}", sent, MAIN, d):
                grad_chunks.append(part if d == MAIN else part.clone())

        # 7. parallel backward: each device back-propagates through its own replica, in its thread
        def backward(d):
            with trace.record("parallel backward", d, f"backward of {len(chunks[d])} rows"):
                outputs[d].backward(grad_chunks[d])

        run_in_threads(used, backward)

        # 8. reduce gradients: each device's parameter gradients are copied to the main device and added
        with trace.record(
            "reduce gradients", MAIN, "dev0's own gradients are already in place", 0, MAIN, MAIN
        ):
            pass
        for d in range(1, used):
            grads = [p.grad for p in self.replicas[d].parameters()]
            with trace.record(
                "reduce gradients", MAIN, f"gradients dev{d} -> dev0, added", nbytes(grads), d, MAIN
            ):
                for main, incoming in zip(weights, grads, strict=True):
                    main.grad.add_(incoming.clone())

        # 9. update: only the main device's weights change; step 2 copies them out next time
        with trace.record("update", MAIN, "SGD step on dev0's weights"):
            self.optimizer.step()

        # what each device holds now (activations are freed by backward and not counted)
        state = [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        trace.hold(
            MAIN, x, y, weights, [p.grad for p in weights], state, gathered, grad_outputs, outputs[MAIN]
        )
        for d in range(1, used):
            replica = list(self.replicas[d].parameters())
            trace.hold(d, chunks[d], replica, [p.grad for p in replica], outputs[d], grad_chunks[d])
        trace.loss = loss.item()
        return trace


def single_device_step(model: nn.Module, x, y, optimizer=None) -> float:
    """The reference: one plain training step on one device with the whole batch; returns the loss."""
    optimizer = optimizer or make_optimizer(model)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


# --- plots of what was measured ----------------------------------------------------------------------


def plot_timeline(trace: Trace, title: str = ""):
    """One lane per virtual device, one colour per step: :func:`helpers.plots.timeline` on a trace."""
    from helpers import plots

    return plots.timeline(trace.spans(), title=title, colors=STEP_COLORS)
