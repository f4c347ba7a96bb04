"""DataParallel from the inside: the nine steps of one training step on K virtual devices, traced.

torch.nn.DataParallel (数据并行) is single-process, multi-thread (单进程多线程): one process owns the
weights on the main device (主 GPU) and, every step, scatters the batch, replicates the model, runs one
thread per device and collects the results back. :class:`ThreadedDataParallel` does the same on the CPU
with K *virtual* devices (a thread and its own copy of every tensor each) and records every step in a
:class:`Trace`: what moved, how many bytes, how long it took, in which thread.
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from helpers import compare
from helpers.errors import CourseError

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
    """A freshly initialised model; the same ``seed`` gives the same weights in every process."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    features = spec.inputs
    for _ in range(spec.depth):
        layers += [nn.Linear(features, spec.width), nn.ReLU()]
        features = spec.width
    layers.append(nn.Linear(features, spec.classes))
    return nn.Sequential(*layers)


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


def nbytes(*tensors) -> int:
    """Bytes of the given tensors (or of every tensor in the given lists / modules)."""
    total = 0
    for t in tensors:
        if isinstance(t, nn.Module):
            total += sum(p.numel() * p.element_size() for p in t.parameters())
        elif isinstance(t, (list, tuple)):
            total += nbytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


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

    def _in_threads(self, work) -> None:
        run_in_threads(self.k, work)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> Trace:
        """One training step on the global batch ``(x, y)``, following the seed's nine steps."""
        k, trace = self.k, Trace(self.k)
        if len(x) < k:
            raise CourseError(f"a batch of {len(x)} rows cannot be split over {k} devices; use at least {k}.")
        weights = list(self.model.parameters())
        self.optimizer.zero_grad(set_to_none=True)
        for replica in self.replicas[1:]:
            replica.zero_grad(set_to_none=True)

        # 1. scatter inputs: the main device sends each device its slice of the batch
        chunks = []
        for d, part in enumerate(x.tensor_split(k)):
            sent = nbytes(part) if d != MAIN else 0  # the main device's slice stays where it is
            with trace.record("scatter inputs", MAIN, f"x[{len(part)} rows] -> dev{d}", sent, MAIN, d):
                chunks.append(part if d == MAIN else part.clone())

        # 2. replicate model: the main device's current weights are copied to every other device
        with trace.record("replicate model", MAIN, "dev0 runs on the main weights themselves", 0, MAIN, MAIN):
            pass
        for d in range(1, k):
            with trace.record("replicate model", MAIN, f"weights -> dev{d}", nbytes(weights), MAIN, d):
                with torch.no_grad():
                    for mine, main in zip(self.replicas[d].parameters(), weights, strict=True):
                        mine.copy_(main)

        # 3. parallel forward: one thread per device, each on its own replica and slice
        outputs: list[torch.Tensor | None] = [None] * k

        def forward(d):
            with trace.record("parallel forward", d, f"forward of {len(chunks[d])} rows"):
                outputs[d] = self.replicas[d](chunks[d])

        self._in_threads(forward)

        # 4. gather outputs: every device's outputs are copied to the main device and joined
        pieces = []
        for d in range(k):
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
        for d, part in enumerate(grad_outputs.tensor_split(k)):
            sent = nbytes(part) if d != MAIN else 0
            with trace.record("loss gradient", MAIN, f"d loss/d outputs -> dev{d}", sent, MAIN, d):
                grad_chunks.append(part if d == MAIN else part.clone())

        # 7. parallel backward: each device back-propagates through its own replica, in its thread
        def backward(d):
            with trace.record("parallel backward", d, f"backward of {len(chunks[d])} rows"):
                outputs[d].backward(grad_chunks[d])

        self._in_threads(backward)

        # 8. reduce gradients: each device's parameter gradients are copied to the main device and added
        with trace.record(
            "reduce gradients", MAIN, "dev0's own gradients are already in place", 0, MAIN, MAIN
        ):
            pass
        for d in range(1, k):
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
        for d in range(1, k):
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


# --- measurements -------------------------------------------------------------------------------------


def burden(spec: ModelSpec, batch: int, k_max: int, repeats: int = 3) -> list[dict]:
    """For K = 1..k_max: what the main device moves, holds and spends against the average other device.

    Each K runs ``repeats`` steps; bytes come from the last step, CPU times are medians over the steps.
    CPU time (``time.thread_time``) counts the work itself; a lane's wall time would also count the
    time its thread waited for the GIL or for a free core.
    """
    rows = []
    x, y = make_batch(spec, batch)
    for k in range(1, k_max + 1):
        dp = ThreadedDataParallel(make_model(spec), k)
        traces = [dp.step(x, y) for _ in range(repeats)]
        last = traces[-1]
        cpu = [statistics.median(t.cpu()[d] for t in traces) for d in range(k)]
        moved, held = last.moved(), last.held_bytes()
        others = range(1, k)
        rows.append(
            {
                "K": k,
                "main MB moved": moved[MAIN] / 2**20,
                "other MB moved": _mean(moved, others) / 2**20,
                "main MB held": held[MAIN] / 2**20,
                "other MB held": _mean(held, others) / 2**20,
                "main CPU ms": cpu[MAIN] * 1e3,
                "other CPU ms": _mean(cpu, others) * 1e3,
                "main share of bytes moved": moved[MAIN] / sum(moved) if sum(moved) else 1.0,
                "main share of CPU time": cpu[MAIN] / sum(cpu),
            }
        )
    return rows


def _mean(values, indices) -> float:
    """Mean of ``values`` at ``indices`` (NaN when there are none)."""
    indices = list(indices)
    return sum(values[i] for i in indices) / len(indices) if indices else float("nan")


def step_times(spec: ModelSpec, batch: int, k_max: int, steps: int, warmup: int = 1) -> list[dict]:
    """Median wall time of one training step: one device (plain PyTorch), then K = 1..k_max threads.

    Every configuration gets the same global batch. The configurations take turns, one step each,
    so a machine that gets busier or quieter meanwhile affects them all alike. Each threaded row also
    carries the wall time of the forward and backward phases and the CPU time their threads used.
    """
    x, y = make_batch(spec, batch)
    model = make_model(spec)
    optimizer = make_optimizer(model)
    parallel = {k: ThreadedDataParallel(make_model(spec), k) for k in range(1, k_max + 1)}
    walls: dict[int, list[float]] = {k: [] for k in [0, *parallel]}
    phase_walls: dict[int, list[float]] = {k: [] for k in parallel}
    phase_cpus: dict[int, list[float]] = {k: [] for k in parallel}
    for i in range(warmup + steps):
        start = time.perf_counter()
        single_device_step(model, x, y, optimizer)
        if i >= warmup:
            walls[0].append(time.perf_counter() - start)
        for k, dp in parallel.items():
            start = time.perf_counter()
            trace = dp.step(x, y)
            wall = time.perf_counter() - start
            if i < warmup:
                continue
            walls[k].append(wall)
            work = [e for e in trace.events if e.step in ("parallel forward", "parallel backward")]
            phase_walls[k].append(
                sum(
                    max(e.end for e in work if e.step == s) - min(e.start for e in work if e.step == s)
                    for s in ("parallel forward", "parallel backward")
                )
            )
            phase_cpus[k].append(sum(e.cpu for e in work))
    rows = [
        {
            "config": "one device",
            "K": 0,
            "step ms": statistics.median(walls[0]) * 1e3,
            "fwd+bwd wall ms": "",
            "fwd+bwd thread CPU ms": "",
        }
    ]
    for k in parallel:
        rows.append(
            {
                "config": f"K={k} threads",
                "K": k,
                "step ms": statistics.median(walls[k]) * 1e3,
                "fwd+bwd wall ms": statistics.median(phase_walls[k]) * 1e3,
                "fwd+bwd thread CPU ms": statistics.median(phase_cpus[k]) * 1e3,
            }
        )
    return rows


def train_threaded(spec: ModelSpec, batch: int, steps: int, k: int, lr: float = 0.05, warmup: int = 1):
    """Train ``steps`` steps with :class:`ThreadedDataParallel` on K devices (batch seeds 1000 + step).

    Returns the trained model and the wall time of each step after ``warmup``; step ``i`` uses
    ``make_batch(spec, batch, seed=1000 + i)``, exactly as the DDP script in the lesson does.
    """
    model = make_model(spec)
    dp = ThreadedDataParallel(model, k, lr=lr)
    times = []
    for i in range(steps + warmup):
        x, y = make_batch(spec, batch, seed=1000 + i)
        start = time.perf_counter()
        dp.step(x, y)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return model, times


def train_single_device(spec: ModelSpec, batch: int, steps: int, lr: float = 0.05, warmup: int = 1):
    """The reference for :func:`train_threaded`: plain PyTorch on one device, same batches and steps."""
    model = make_model(spec)
    optimizer = make_optimizer(model, lr)
    times = []
    for i in range(steps + warmup):
        x, y = make_batch(spec, batch, seed=1000 + i)
        start = time.perf_counter()
        single_device_step(model, x, y, optimizer)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return model, times


def train_torch_dataparallel(spec: ModelSpec, batch: int, steps: int, device_ids, lr=0.05, warmup=1):
    """The same training with the real torch.nn.DataParallel over CUDA ``device_ids`` (GPU only)."""
    main = torch.device("cuda", device_ids[0])
    model = make_model(spec).to(main)
    dp = nn.DataParallel(model, device_ids=device_ids)
    optimizer = make_optimizer(model, lr)
    times = []
    for i in range(steps + warmup):
        x, y = make_batch(spec, batch, seed=1000 + i)
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(dp(x.to(main)), y.to(main)).backward()
        optimizer.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return model.cpu(), times


# --- the real nn.DataParallel ---------------------------------------------------------------------------


@contextmanager
def count_thread_starts():
    """Count the threads started inside the block: ``with count_thread_starts() as started: ...``."""
    started = [0]
    original = threading.Thread.start

    def counting(self, *args, **kwargs):
        started[0] += 1
        return original(self, *args, **kwargs)

    threading.Thread.start = counting
    try:
        yield started
    finally:
        threading.Thread.start = original


def torch_dataparallel_on_cpu(spec: ModelSpec, batch: int) -> dict:
    """Wrap a model in the real nn.DataParallel where no GPU is visible, and watch what it does."""
    x, y = make_batch(spec, batch)
    plain, module = make_model(spec), make_model(spec)
    wrapped = nn.DataParallel(module)
    calls = dict.fromkeys(("module.forward", "scatter", "replicate", "parallel_apply", "gather"), 0)

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    for name in ("scatter", "replicate", "parallel_apply", "gather"):
        setattr(wrapped, name, counted(name, getattr(wrapped, name)))
    module.register_forward_hook(lambda *_: calls.__setitem__("module.forward", calls["module.forward"] + 1))
    with count_thread_starts() as started:
        out_wrapped = wrapped(x)
        F.cross_entropy(out_wrapped, y).backward()
    out_plain = plain(x)
    F.cross_entropy(out_plain, y).backward()
    return {
        "device_ids": list(wrapped.device_ids),
        "wraps the module itself": wrapped.module is module,
        "calls": calls,
        "threads started": started[0],
        "max output difference": (out_plain - out_wrapped).abs().max().item(),
        "max gradient difference": compare.largest_difference(compare.gradients(plain), compare.gradients(module)),
    }


def torch_pieces_on_gpus(spec: ModelSpec, batch: int, device_ids) -> dict:
    """Run torch.nn.parallel's scatter, replicate, parallel_apply and gather by hand on real GPUs and
    compare outputs and gradients with :class:`ThreadedDataParallel` on the CPU (same K, same batch)."""
    from torch.nn.parallel import gather, parallel_apply, replicate, scatter

    main = torch.device("cuda", device_ids[0])
    x, y = make_batch(spec, batch)
    model = make_model(spec).to(main)
    inputs = scatter(x.to(main), device_ids)  # 1. scatter inputs
    replicas = replicate(model, device_ids[: len(inputs)])  # 2. replicate model
    outputs = parallel_apply(replicas, list(inputs))  # 3. parallel forward, one thread per GPU
    gathered = gather(outputs, main)  # 4. gather outputs on the main GPU
    loss = F.cross_entropy(gathered, y.to(main))  # 5. loss on the main GPU
    loss.backward()  # 6.-8. loss gradient, backward on every GPU, gradients reduced onto `model`

    mine = make_model(spec)
    trace = ThreadedDataParallel(mine, len(device_ids)).step(x, y)  # .grad survives the update
    return {
        "replicas": len(replicas),
        "replica devices": [str(next(r.parameters()).device) for r in replicas],
        "chunk rows": [len(c) for c in inputs],
        "loss difference": abs(loss.item() - trace.loss),
        "max gradient difference": max(
            (p.grad.cpu() - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), mine.parameters(), strict=True)
        ),
    }


def torch_stage_costs(spec: ModelSpec, batch: int, device_ids, repeats: int = 5) -> dict:
    """What torch's DataParallel costs every step on real GPUs: each of its stages timed (CUDA synchronised,
    median of ``repeats`` after one warm-up step), and each GPU's peak memory over those steps."""
    from torch.nn.parallel import gather, parallel_apply, replicate, scatter

    main = torch.device("cuda", device_ids[0])
    x, y = (t.to(main) for t in make_batch(spec, batch))
    model = make_model(spec).to(main)
    stages: dict[str, list[float]] = {}

    def timed(name, fn):
        for d in device_ids:
            torch.cuda.synchronize(d)
        start = time.perf_counter()
        out = fn()
        for d in device_ids:
            torch.cuda.synchronize(d)
        stages.setdefault(name, []).append(time.perf_counter() - start)
        return out

    for d in device_ids:
        torch.cuda.reset_peak_memory_stats(d)
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        inputs = timed("scatter inputs", lambda: scatter(x, device_ids))
        replicas = timed("replicate model (every step)", lambda: replicate(model, device_ids[: len(inputs)]))  # noqa: B023
        outputs = timed("parallel forward", lambda: parallel_apply(replicas, list(inputs)))  # noqa: B023
        gathered = timed("gather outputs on GPU 0", lambda: gather(outputs, main))  # noqa: B023
        timed("loss on GPU 0, backward, reduce", lambda: F.cross_entropy(gathered, y).backward())  # noqa: B023
    return {
        "ms": {name: 1e3 * statistics.median(t[1:]) for name, t in stages.items()},
        "peak MiB": [torch.cuda.max_memory_allocated(d) / 2**20 for d in device_ids],
    }


# --- plots of what was measured ----------------------------------------------------------------------


def plot_timeline(trace: Trace, title: str = ""):
    """One lane per virtual device, one colour per step: :func:`helpers.plots.timeline` on a trace."""
    from helpers import plots

    return plots.timeline(trace.spans(), title=title, colors=STEP_COLORS)


def plot_burden(rows: list[dict]):
    """Bytes moved, bytes held and busy time per step: the main device against the average other one."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    ks = [r["K"] for r in rows]
    panels = (
        ("MB moved", "MB copied in or out per step"),
        ("MB held", "MB held at the end of a step"),
        ("CPU ms", "CPU ms of work per step (median)"),
    )
    for ax, (what, ylabel) in zip(axes, panels, strict=True):
        main = [r[f"main {what}"] for r in rows]
        other = [r[f"other {what}"] for r in rows]
        ax.bar([k - 0.2 for k in ks], main, width=0.4, color=PALETTE[3], label="dev0 (main)")
        ax.bar([k + 0.2 for k in ks], other, width=0.4, color=PALETTE[0], label="other devices (mean)")
        ax.set_xticks(ks)
        ax.set_xlabel("K virtual devices")
        ax.set_ylabel(ylabel)
        ax.set_title({"CPU ms": "CPU time used"}.get(what, what))
    axes[0].legend(frameon=False, loc="upper left")
    fig.suptitle("The main device's burden, measured from the trace (one process, CPU)")
    fig.tight_layout()
    return fig


def plot_step_times(results: dict[str, list[dict]]):
    """Step time against K for each model: milliseconds, speed-up over one device, and how many
    threads were computing at once (their CPU time over the wall time of forward + backward)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, rows in results.items():
        one, threaded = rows[0]["step ms"], rows[1:]
        ks = [r["K"] for r in threaded]
        (line,) = left.plot(ks, [r["step ms"] for r in threaded], marker="o", label=name)
        left.axhline(one, ls=":", lw=1, color=line.get_color())
        middle.plot(ks, [one / r["step ms"] for r in threaded], marker="o", label=name)
        ratio = [r["fwd+bwd thread CPU ms"] / r["fwd+bwd wall ms"] for r in threaded]
        right.plot(ks, ratio, marker="o", label=name)
    left.set_yscale("log")
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.yaxis.set_minor_formatter(NullFormatter())
    left.set_ylabel("ms per step (median; dotted: one device)")
    middle.axhline(1, color="black", lw=1)
    middle.set_ylabel("speed-up over one device (>1 is faster)")
    right.set_ylabel("threads' CPU time / wall time")
    right.set_title("fwd + bwd: threads computing at once", fontsize=10)
    right.set_ylim(bottom=0)
    for ax in (left, middle, right):
        ax.set_xticks(ks)
        ax.set_xlabel("K threads (virtual devices)")
    middle.legend(frameon=False)
    fig.suptitle("One process, K threads, the same global batch: measured step time")
    fig.tight_layout()
    return fig


def plot_dp_vs_ddp(times: dict[str, list[float]]):
    """Every measured step time of each approach (dots) and its median (bar), one row each."""
    import matplotlib.pyplot as plt

    from helpers.plots import PALETTE

    fig, ax = plt.subplots(figsize=(8, 0.8 * len(times) + 1.4))
    labels = []
    for i, (name, seconds) in enumerate(times.items()):
        ms = [s * 1e3 for s in seconds]
        ax.barh(i, statistics.median(ms), color=PALETTE[i], alpha=0.45, height=0.6)
        ax.plot(ms, [i] * len(ms), "o", color=PALETTE[i], ms=4)
        labels.append(f"{name}\nmedian {statistics.median(ms):.1f} ms")
    ax.set_yticks(range(len(times)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (measured; bar: median, dots: every step)")
    ax.set_xlim(left=0)
    ax.set_title("Same model, same global batch, same steps")
    fig.tight_layout()
    return fig
