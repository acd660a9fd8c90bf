"""The training-loop hook: a few lines that time each phase of a step on each rank.

A profiler trace tells you everything about two steps; this hook tells you a little
about every step, cheaply enough to leave on: per rank and step, the duration of
each phase (``load``, ``forward``, ``backward``, ``allreduce``, ``optimizer``), the
local gradient norm *before* the reduction (a rank whose norm is far from the
others' holds poisoned data or a flipped bit), the loss and the number of parameters
whose gradient holds a NaN or Inf, and optionally (``sketch_dims``) a random
projection of the local gradient, whose direction security/gradients.py compares
across ranks (a rank that flips its gradient keeps its norm but not its direction)::

    from hpcwatch.instrument.torch import StepRecorder
    rec = StepRecorder(job="4242", rank=dist.get_rank(), out_dir="hook/", node=host, gpu=local_rank)
    for step, batch in enumerate(loader):
        with rec.step(step):
            with rec.phase("load"): x, y = next(batch)
            with rec.phase("forward"): loss = loss_fn(model(x), y)
            with rec.phase("backward"): loss.backward()
            rec.gradients(model.parameters())     # before the all-reduce
            with rec.phase("allreduce"): all_reduce_grads(model)
            with rec.phase("optimizer"): opt.step(); opt.zero_grad()
            rec.loss(loss)
    rec.close()

On a GPU, phases are timed with CUDA events (the host only enqueues work, so
``perf_counter`` would time the launch, not the kernels) and read back one step
later, so the hook never adds a synchronisation of its own; on CPU it uses
``perf_counter``. Gradient statistics are reduced on the device and copied with the loss
in one non-blocking transfer per step.

Output: one JSON-lines file per rank (``rank-N.jsonl``), one record a line,
``{"kind": "span", job, rank, step, phase, start, dur, attrs}`` (a ``records.Span``)
or ``{"kind": "sample", metric, labels, t, value}`` (a ``records.Sample``) with the
metrics ``train_grad_norm``, ``train_grad_nonfinite``, ``train_loss``,
``train_step_time_s`` and labels ``job``, ``rank``, ``step``, ``node``, ``gpu``; with
``sketch_dims=K``, K more samples ``train_grad_sketch`` a step with one more label ``dim``
(0..K-1), the shape ``security.gradients.gradient_samples`` writes and its detector reads.

The sketch is a CountSketch-style signed projection (Charikar, Chen & Farach-Colton 2002):
element ``i`` of the flattened gradient (parameters in the order given, those without a
gradient counted too, so every rank numbers them alike) is added with sign ``s(i)`` to
bucket ``i mod K``. ``s(i)`` is a ±1 table of ``_SIGN_PERIOD`` entries (a prime) drawn from
``sketch_seed`` on the CPU, so every rank, GPU or not, uses the same signs; two elements
share both sign and bucket only ``K * _SIGN_PERIOD`` elements apart. E<Sx, Sy> = <x, y>, so
cosines of sketches estimate cosines of gradients with an error near 1/sqrt(K). Cost: one
multiply-and-sum pass over the gradient (no d×K matrix, no per-element hashing), a few
MiB of table per device and dtype.
``sources.hook.read_hook_jsonl`` reads them back. With ``prometheus_port`` the same values are
also served as gauges (``prometheus_client``), without the ``step`` label.

torch is imported when a recorder is made, never at import time.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.instrument.live import LIVE_DIR_ENV, LIVE_TOKEN_FILE_ENV, LIVE_URL_ENV, LiveStream
from hpcwatch.records import Sample, Span
from hpcwatch.sources.livehook import trace_name

if TYPE_CHECKING:  # for the annotations only: torch is imported when a recorder is made
    from torch import Tensor
    from torch.cuda import Event as CudaEvent

__all__ = ["StepRecorder", "HookConfig", "HOOK_METRICS", "SKETCH_METRIC", "TORCH_MISSING"]

#: The metrics the hook writes (the brief's contract with the store and the web app).
HOOK_METRICS: tuple[str, ...] = (
    vocab.TRAIN_GRAD_NORM,
    vocab.TRAIN_GRAD_NONFINITE,
    vocab.TRAIN_LOSS,
    vocab.TRAIN_STEP_TIME_S,
)
#: The sketch metric (``sketch_dims`` samples a step, label ``dim``); see security/gradients.py.
SKETCH_METRIC = vocab.TRAIN_GRAD_SKETCH
#: Length of the ±1 sign table: a prime (so no bucket count K divides it; 2^20 - 3), large enough that
#: an element's sign repeats in its bucket only K * period elements later, small enough (4 MiB in fp32)
#: to keep one copy per device.
_SIGN_PERIOD = 1_048_573
#: Small gradients are concatenated up to this many elements before the pass (one kernel, not hundreds).
_SKETCH_BATCH = 1 << 18
#: A long gradient is sketched this many sign periods at a time (whole periods share their signs): one chain of
#: kernels per 16 M elements, not per 1 M. On one H200 a 268M-parameter model's sketch was launch-bound at one
#: chain a period (~1,300 launches, 29 ms a step).
_SKETCH_ROWS = 16

TORCH_MISSING = "the PyTorch hook needs torch: pip install hpcwatch[torch]"


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise ImportError(TORCH_MISSING) from err
    return torch


@dataclass(frozen=True, slots=True, kw_only=True)
class HookConfig:
    """What the recorder writes and where."""

    job: str
    """Job id (Slurm ``SLURM_JOB_ID``), the ``job`` of every span and sample."""
    rank: int
    """Global rank of this process."""
    out_dir: Path | None = None
    """Folder of the ``rank-N.jsonl`` files; ``None`` keeps records in memory only."""
    node: str | None = None
    """Host name, added to the labels and span attrs."""
    gpu: int | None = None
    """Local GPU index; ``None`` on CPU."""
    device: str = "cpu"
    """``cpu`` (perf_counter) or ``cuda`` (CUDA events)."""
    prometheus_port: int | None = None
    """Serve the gauges on 127.0.0.1:PORT too."""
    keep: bool = True
    """Keep the records in ``StepRecorder.records`` as well."""
    grad_every: int = 1
    """Gradient statistics every N steps (their cost is one read of every gradient)."""
    sketch_dims: int = 0
    """Buckets of the gradient sketch (``train_grad_sketch``); 0 writes none. security/gradients.py
    uses 32 (``SKETCH_DIMS``); the cost does not grow with it."""
    sketch_seed: int = 0
    """Seed of the sketch's signs: the same on every rank of a job, or the sketches do not compare."""
    live_dir: Path | str | None = None
    """The per-node spool folder of the live stream (``instrument.live``); ``None``: the environment's
    ``HPCWATCH_LIVE_DIR``, read once when the recorder is made (unset or empty: no stream)."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"HookConfig.rank must be >= 0, got {self.rank}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"HookConfig.device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.grad_every < 1:
            raise ConfigError(f"HookConfig.grad_every must be >= 1, got {self.grad_every}")
        if not 0 <= self.sketch_dims <= 4096:
            raise ConfigError(f"HookConfig.sketch_dims must be in 0..4096, got {self.sketch_dims}")
        if self.prometheus_port is not None and not 0 <= self.prometheus_port < 65536:
            raise ConfigError(f"HookConfig.prometheus_port must be a TCP port, got {self.prometheus_port}")


class _Timer:
    """One phase's timing: wall start (UTC s) and either two perf_counter values or two CUDA events."""

    __slots__ = ("e0", "e1", "phase", "start_utc", "t0", "t1")
    e0: CudaEvent | None
    e1: CudaEvent | None

    def __init__(self, phase: str, start_utc: float) -> None:
        self.phase = phase
        self.start_utc = start_utc
        self.t0 = self.t1 = 0.0
        self.e0 = self.e1 = None

    def seconds(self) -> float:
        if self.e0 is not None and self.e1 is not None:  # set together, by StepRecorder.phase
            self.e1.synchronize()  # this event only; normally long done
            return self.e0.elapsed_time(self.e1) / 1e3  # ms → s
        return self.t1 - self.t0


class StepRecorder:
    """Times the phases of each step on one rank and writes spans and samples."""

    def __init__(self, config: HookConfig | None = None, **fields: Any) -> None:
        self.config = config if config is not None else HookConfig(**fields)
        self._torch = _torch()
        self.records: list[Span | Sample] = []
        self._file = self._open_file()
        port = self.config.prometheus_port
        self._gauges = self._serve(port) if port is not None else None
        self._pending: list[tuple[int, float, list[_Timer], _Staged]] = []
        self._step: int | None = None
        self._timers: list[_Timer] = []
        self._stats: list[Any] = []  # [(name, tensor)] read at step end
        self._signs: dict[tuple[Any, Any], Any] = {}  # (device, dtype) -> (sign table twice over, scratch)
        self._live = self._open_live()
        self._profiler: Any = None  # an on-demand trace in progress: (profiler, request id, steps left)
        self._trace: tuple[str, int] | None = None

    # --- the API a training loop calls ---------------------------------------------------------
    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Wrap one training step; its records are written when the step is resolved."""
        self._step, self._timers, self._stats = step, [], []
        if self._live is not None and self._profiler is None:
            self._start_trace(self._live.take_trace())
        start_utc, t0 = time.time(), time.perf_counter()
        try:
            yield
        finally:
            self._stats.append(("step_time_s", time.perf_counter() - t0))
            self._pending.append((step, start_utc, self._timers, _Staged(self._torch, self._stats)))
            self._step = None
            self._resolve(final=self.config.device == "cpu")
            if self._profiler is not None:
                self._trace_step()

    @contextlib.contextmanager
    def phase(self, name: str, collective: str | None = None) -> Iterator[None]:
        """Time one phase of the current step (``records.PHASES`` or a finer name); ``collective`` names the
        collective the phase waits in (``all_reduce``), which the live stream reports if the rank stops there."""
        if self._live is not None:
            self._live.enter(self._step, name, collective)
        if self._profiler is not None:  # an on-demand trace: the phases as annotations, as the steps analysis reads
            with self._torch.profiler.record_function(name):
                yield from self._timed(name)
        else:
            yield from self._timed(name)

    def _timed(self, name: str) -> Iterator[None]:
        timer = _Timer(name, time.time())
        if self.config.device == "cuda":
            cuda = self._torch.cuda
            e0: CudaEvent = cuda.Event(enable_timing=True)
            e1: CudaEvent = cuda.Event(enable_timing=True)
            timer.e0, timer.e1 = e0, e1
            e0.record()
            yield
            e1.record()
        else:
            timer.t0 = time.perf_counter()
            yield
            timer.t1 = time.perf_counter()
        self._timers.append(timer)

    def gradients(self, parameters: Iterable[Any]) -> None:
        """Local gradient norm of this rank (call before reducing the gradients) and its NaN/Inf count.

        The count is of parameters whose gradient holds a NaN or Inf: it comes free with
        the per-parameter norms (a NaN or Inf makes a norm non-finite), where counting
        elements would cost another pass over every gradient. With ``sketch_dims`` it also
        sketches the gradients (one more pass; pass every parameter, in the same order on
        every rank, so the elements are numbered alike).
        """
        if self._step is not None and self._step % self.config.grad_every:
            return
        torch = self._torch
        parameters_seen = list(parameters)  # may be a generator, and the sketch walks it again
        grads = [p.grad.detach() for p in parameters_seen if getattr(p, "grad", None) is not None]
        if not grads:
            return
        norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])  # fused per dtype/device
        self._stats.append(("grad_norm", torch.linalg.vector_norm(norms)))
        self._stats.append(("grad_nonfinite", (~torch.isfinite(norms)).sum()))
        if self.config.sketch_dims:
            self._stats.append(("grad_sketch", self._sketch(parameters_seen)))

    def _sketch(self, params: list[Any]) -> Any:
        """The signed bucket sums of the flattened gradients (see the module docstring)."""
        torch, k = self._torch, self.config.sketch_dims
        acc, batch_start, offset = None, 0, 0
        batch: list[Tensor] = []
        for p in params:
            grad = getattr(p, "grad", None)
            if grad is not None:
                flat = grad.detach().reshape(-1)
                big = flat.numel() >= _SKETCH_BATCH // 8  # worth a pass of its own, not a copy
                if batch and (big or flat.dtype != batch[0].dtype or flat.device != batch[0].device):
                    acc = self._sketch_add(acc, batch, batch_start)
                    batch = []
                if big:
                    acc = self._sketch_add(acc, [flat], offset)
                else:
                    if not batch:
                        batch_start = offset
                    batch.append(flat)
                    if sum(b.numel() for b in batch) >= _SKETCH_BATCH:
                        acc = self._sketch_add(acc, batch, batch_start)
                        batch = []
            elif batch:  # a gap in the numbering: the batch must stay contiguous
                acc = self._sketch_add(acc, batch, batch_start)
                batch = []
            offset += p.numel()
        if batch:
            acc = self._sketch_add(acc, batch, batch_start)
        return acc if acc is not None else torch.zeros(k)

    def _sketch_add(self, acc: Any, batch: list[Any], start: int) -> Any:
        """Add the gradient elements ``start, start+1, ...`` (one contiguous run) to the buckets."""
        torch, k = self._torch, self.config.sketch_dims
        flat = batch[0] if len(batch) == 1 else torch.cat(batch)
        signs, scratch = self._sign_table(flat.device, flat.dtype)
        if acc is None:
            acc = torch.zeros(k, dtype=torch.float32, device=flat.device)
        pos = 0
        while pos < flat.numel():
            at = (start + pos) % _SIGN_PERIOD  # the table is stored twice: any run <= period is one slice
            rows = min((flat.numel() - pos) // _SIGN_PERIOD, _SKETCH_ROWS)
            if rows >= 2:
                block = flat[pos : pos + rows * _SIGN_PERIOD].view(rows, _SIGN_PERIOD)
                acc += self._sketch_periods(block, signs[at : at + _SIGN_PERIOD], start + pos).to(acc.device)
                pos += rows * _SIGN_PERIOD
                continue
            n = min(flat.numel() - pos, _SIGN_PERIOD)
            signed = torch.mul(flat[pos : pos + n], signs[at : at + n], out=scratch[:n])  # reused: no page faults
            body = n - n % k
            part = signed[:body].view(-1, k).sum(0, dtype=torch.float32)  # column j = bucket (start+pos+j) % k
            part[: n - body] += signed[body:].float()
            acc += torch.roll(part, (start + pos) % k).to(acc.device)
            pos += n
        return acc

    def _sketch_periods(self, block: Any, signs: Any, first: int) -> Any:
        """The buckets of ``block``: whole sign periods, row r holding elements ``first + r * period + j``. Every
        row takes the same signs; row r's element j goes to bucket ``(first + r * period + j) % k``, so each row's
        column sums are rolled by their own shift (one gather) before the rows are added."""
        torch, k = self._torch, self.config.sketch_dims
        rows, period = block.shape
        signed = block * signs
        body = period - period % k
        # the first `body` elements of each row as (rows, body / k, k), without a copy: column c = elements j ≡ c
        part = signed.as_strided((rows, body // k, k), (period, k, 1)).sum(1, dtype=torch.float32)
        part[:, : period - body] += signed[:, body:].float()  # j = body + c, and body % k == 0
        shifts = (first + torch.arange(rows, device=block.device) * period) % k
        columns = (torch.arange(k, device=block.device) - shifts[:, None]) % k  # torch.roll, a shift a row
        return part.gather(1, columns).sum(0)

    def _sign_table(self, device: Any, dtype: Any) -> tuple[Any, Any]:
        """The ±1 table (stored twice over, for wrap-free slices) and a scratch buffer of one period."""
        key = (device, dtype)
        if key not in self._signs:
            torch = self._torch
            gen = torch.Generator().manual_seed(self.config.sketch_seed)  # CPU: identical on every rank
            signs = torch.randint(0, 2, (_SIGN_PERIOD,), generator=gen, dtype=torch.int8) * 2 - 1
            self._signs[key] = (
                torch.cat([signs, signs]).to(device=device, dtype=dtype),
                torch.empty(_SIGN_PERIOD, device=device, dtype=dtype),
            )
        return self._signs[key]

    def loss(self, loss: Any) -> None:
        """The step's loss (a tensor or a float)."""
        self._stats.append(("loss", loss.detach() if hasattr(loss, "detach") else float(loss)))

    def close(self) -> None:
        """Resolve what is pending and close the file."""
        self._resolve(final=True)
        if self._profiler is not None:
            self._end_trace()
        if self._live is not None:
            self._live.close()
            self._live = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- resolution and output -------------------------------------------------------------------
    def _resolve(self, *, final: bool) -> None:
        # On CUDA the last step's events may still be in flight: keep it until the next step ends.
        ready = self._pending if final else self._pending[:-1]
        self._pending = [] if final else self._pending[-1:]
        for step, start_utc, timers, stats in ready:
            self._emit(step, start_utc, timers, stats)

    def _emit(self, step: int, start_utc: float, timers: list[_Timer], stats: _Staged) -> None:
        cfg = self.config
        attrs: dict[str, Any] = {k: v for k, v in (("node", cfg.node), ("gpu", cfg.gpu)) if v is not None}
        labels = {"job": cfg.job, "rank": str(cfg.rank), "step": str(step)}
        labels.update({k: str(v) for k, v in attrs.items()})
        attrs["clock"] = "cuda_event" if cfg.device == "cuda" else "cpu"
        out: list[Span | Sample] = [
            Span(job=cfg.job, rank=cfg.rank, step=step, phase=t.phase, start=t.start_utc, dur=t.seconds(), attrs=attrs)
            for t in timers
        ]
        values = stats.values()
        t_end = start_utc + values.get("step_time_s", 0.0)
        names = {
            "grad_norm": vocab.TRAIN_GRAD_NORM,
            "grad_nonfinite": vocab.TRAIN_GRAD_NONFINITE,
            "loss": vocab.TRAIN_LOSS,
            "step_time_s": vocab.TRAIN_STEP_TIME_S,
        }
        sketch = values.pop("grad_sketch", None)
        out += [Sample(metric=names[k], labels=labels, t=t_end, value=v) for k, v in values.items()]
        if sketch is not None:
            out += [
                Sample(metric=SKETCH_METRIC, labels={**labels, "dim": str(i)}, t=t_end, value=v)
                for i, v in enumerate(sketch)
            ]
        self._write(out)

    def _write(self, out: list[Span | Sample]) -> None:
        if self.config.keep:
            self.records.extend(out)
        if self._file is not None:
            self._file.write(b"".join(orjson.dumps(_line(r)) + b"\n" for r in out))
            self._file.flush()
        if self._gauges is not None:
            self._set_gauges(self._gauges, out)
        if self._live is not None:
            for r in out:  # the sketch's samples stay out of the stream: they are for the store, not for the minute
                if isinstance(r, Span) or r.metric != SKETCH_METRIC:
                    self._live.put(_line(r))

    # --- the live stream and its on-demand traces --------------------------------------------------
    def _open_live(self) -> LiveStream | None:
        import os

        spool = self.config.live_dir if self.config.live_dir is not None else os.environ.get(LIVE_DIR_ENV, "")
        if not spool:
            return None
        url = os.environ.get(LIVE_URL_ENV, "")
        if not url:
            return LiveStream(spool, job=self.config.job, rank=self.config.rank)
        token_file = os.environ.get(LIVE_TOKEN_FILE_ENV, "")
        try:
            token = Path(token_file).read_text().strip() if token_file else ""
        except OSError as err:
            raise ConfigError(f"{token_file}: cannot read the live push token: {err.strerror or err}") from err
        node = self.config.node or os.uname().nodename
        return LiveStream(
            spool, job=self.config.job, rank=self.config.rank, flush_s=2.0, push_url=url, token=token, node=node
        )

    def _start_trace(self, request: tuple[str, int] | None) -> None:
        if request is None:
            return
        prof = self._torch.profiler
        activities = [prof.ProfilerActivity.CPU]
        if self.config.device == "cuda":
            activities.append(prof.ProfilerActivity.CUDA)
        self._profiler = prof.profile(activities=activities)
        self._profiler.__enter__()
        self._trace = request

    def _trace_step(self) -> None:
        assert self._trace is not None and self._profiler is not None
        request, left = self._trace
        self._profiler.step()  # ProfilerStep#N: the step windows the steps analysis reads
        self._trace = (request, left - 1)
        if left <= 1:
            self._end_trace()

    def _end_trace(self) -> None:
        import os

        assert self._trace is not None and self._profiler is not None and self._live is not None
        profiler, (request, _), self._profiler, self._trace = self._profiler, self._trace, None, None
        profiler.__exit__(None, None, None)
        target = self._live.folder / trace_name(request, self.config.rank)
        tmp = target.with_name("." + target.name)
        profiler.export_chrome_trace(str(tmp))
        os.replace(tmp, target)
        self._live.answered("trace", request, target)  # pushed: the stream's thread POSTs it

    def _open_file(self):
        if self.config.out_dir is None:
            return None
        out = Path(self.config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return open(out / f"rank-{self.config.rank}.jsonl", "ab")

    def _serve(self, port: int) -> dict[str, Any]:
        import prometheus_client as prom

        registry = prom.CollectorRegistry()
        label_names = ["job", "rank", "node", "gpu"]
        gauges = {
            m: prom.Gauge(m, f"hpcwatch training hook: {m}", label_names, registry=registry) for m in HOOK_METRICS
        }
        gauges[vocab.TRAIN_PHASE_S] = prom.Gauge(
            vocab.TRAIN_PHASE_S,
            "hpcwatch training hook: last step's phase duration",
            label_names + ["phase"],
            registry=registry,
        )
        if self.config.sketch_dims:
            gauges[SKETCH_METRIC] = prom.Gauge(
                SKETCH_METRIC, "hpcwatch training hook: gradient sketch", label_names + ["dim"], registry=registry
            )
        prom.start_http_server(port, addr="127.0.0.1", registry=registry)
        return gauges

    def _set_gauges(self, gauges: dict[str, Any], out: list[Span | Sample]) -> None:
        cfg = self.config
        base = {
            "job": cfg.job,
            "rank": str(cfg.rank),
            "node": cfg.node or "",
            "gpu": "" if cfg.gpu is None else str(cfg.gpu),
        }
        for r in out:
            if isinstance(r, Sample) and r.metric == SKETCH_METRIC:
                gauges[r.metric].labels(**base, dim=r.labels["dim"]).set(r.value)
            elif isinstance(r, Sample):
                gauges[r.metric].labels(**base).set(r.value)
            else:
                gauges[vocab.TRAIN_PHASE_S].labels(**base, phase=r.phase).set(r.dur)


class _Staged:
    """A step's statistics on their way to the host.

    Tensors (scalars, and the sketch's vector) are packed into one and copied with
    ``non_blocking=True`` behind an event, so reading them a step later waits for that
    copy only, never for the whole device.
    """

    __slots__ = ("event", "floats", "names", "packed", "sizes")
    packed: Tensor | None
    event: CudaEvent | None

    def __init__(self, torch: Any, stats: list[tuple[str, Any]]) -> None:
        tensors = [(k, v) for k, v in stats if torch.is_tensor(v)]
        self.floats = {k: float(v) for k, v in stats if not torch.is_tensor(v)}
        self.names = [k for k, _ in tensors]
        self.sizes = [v.numel() if v.dim() else 0 for _, v in tensors]  # 0: a scalar
        self.packed, self.event = None, None
        if tensors:
            device = tensors[0][1].device
            packed = torch.cat([v.detach().float().reshape(-1).to(device) for _, v in tensors])
            if packed.is_cuda:
                self.packed = packed.to("cpu", non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
            else:
                self.packed = packed

    def values(self) -> dict[str, Any]:
        """Each name's float, or list of floats for a vector."""
        if self.event is not None:
            self.event.synchronize()
        flat = self.packed.tolist() if self.packed is not None else []
        out: dict[str, Any] = {}
        pos = 0
        for name, size in zip(self.names, self.sizes):
            out[name] = flat[pos] if size == 0 else flat[pos : pos + size]
            pos += max(size, 1)
        out.update(self.floats)
        return out


def _line(record: Span | Sample) -> dict[str, Any]:
    if isinstance(record, Span):
        return {
            "kind": "span",
            "job": record.job,
            "rank": record.rank,
            "step": record.step,
            "phase": record.phase,
            "start": record.start,
            "dur": record.dur,
            "attrs": dict(record.attrs),
        }
    value = record.value if math.isfinite(record.value) else str(record.value)
    return {"kind": "sample", "metric": record.metric, "labels": dict(record.labels), "t": record.t, "value": value}
