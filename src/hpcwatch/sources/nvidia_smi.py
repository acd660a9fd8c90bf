"""GPU state from ``nvidia-smi -q -x`` (XML), ``nvidia-smi -q`` (text) and ``nvidia-smi --query-gpu=... --format=csv``.

Where there is no dcgm-exporter, nvidia-smi is what a node has. Readings are
renamed to the DCGM fields dcgm-exporter would have exported, so the rest of
hpcwatch sees one vocabulary (https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html):

    utilization.gpu / <gpu_util>           -> DCGM_FI_DEV_GPU_UTIL     (%)
    utilization.memory / <memory_util>     -> DCGM_FI_DEV_MEM_COPY_UTIL (%)
    memory.used / <fb_memory_usage><used>  -> DCGM_FI_DEV_FB_USED      (MiB)
    memory.free / <fb_memory_usage><free>  -> DCGM_FI_DEV_FB_FREE      (MiB)
    power.draw / <instant_power_draw>      -> DCGM_FI_DEV_POWER_USAGE  (W)
    temperature.gpu / <gpu_temp>           -> DCGM_FI_DEV_GPU_TEMP     (C)
    temperature.memory / <memory_temp>     -> DCGM_FI_DEV_MEMORY_TEMP  (C)
    clocks.sm / <sm_clock>                 -> DCGM_FI_DEV_SM_CLOCK     (MHz)
    clocks.mem / <mem_clock>               -> DCGM_FI_DEV_MEM_CLOCK    (MHz)

and, from the XML's ``<pci>`` ("PCI" > "GPU Link Info" in ``nvidia-smi -q``):

    <current_link_gen> / <max_link_gen>     -> DCGM_FI_DEV_PCIE_LINK_GEN / _MAX_LINK_GEN     (1-6)
    <current_link_width> / <max_link_width> -> DCGM_FI_DEV_PCIE_LINK_WIDTH / _MAX_LINK_WIDTH (lanes, "16x")
      (CSV: pcie.link.gen.current / .max, pcie.link.width.current / .max)
    <replay_counter>                        -> DCGM_FI_DEV_PCIE_REPLAY_COUNTER (since the driver loaded)

``max_*`` is what this GPU *and its slot* allow (nvidia-smi(1): a Gen4 GPU in a Gen3 slot says 3), so a
current value under it is a link trained below what both ends can do. The current generation and width "may
be reduced when the GPU is not in use": the reader keeps them as printed, ``analysis.health`` judges them only
beside a busy utilisation of the same snapshot. ``<tx_util>`` / ``<rx_util>`` (KB/s over 20 ms) are skipped.

Labels as dcgm-exporter's: ``gpu`` (index), ``UUID``, ``modelName``,
``pci_bus_id``, ``DCGM_FI_DRIVER_VERSION`` and ``Hostname`` when given; the XML adds ``DCGM_FI_DEV_VBIOS_VERSION``
(``<vbios_version>``, the label dcgm-exporter gives that field) and ``cuda_version`` (``<cuda_version>``: the
CUDA version the driver supports, nvidia-smi's header "CUDA Version"), which the fleet rules compare across nodes. The XML's
compute processes become ``Event(kind="gpu_process")`` with pid, name, type and
``used_memory_bytes``: who holds which GPU memory, for the security checks.

Times: nvidia-smi prints local wall-clock time without a zone; it is read as
UTC unless ``utc_offset_s`` says otherwise. A reading of ``N/A`` or
``[Not Supported]`` gives no sample.

A GPU in MIG mode lists its instances under ``<mig_devices>``; each ``<mig_device>`` gives, as dcgm-exporter
does for a MIG instance, samples of its own: ``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_FB_FREE`` and
``DCGM_FI_DEV_FB_TOTAL`` (MiB, its ``fb_memory_usage``) with the parent GPU's labels (``gpu`` is the parent's
index) plus ``GPU_I_ID`` (``gpu_instance_id``), ``GPU_CI_ID`` (``compute_instance_id``) and ``mig_device``
(its ``index``, nvidia-smi -L's "Device N"); ``analysis.attribution`` keys it ``gpu.GPU_I_ID`` as it does
dcgm-exporter's instance lines. The XML names no MIG profile (``GPU_I_PROFILE`` stays unset) and no
per-instance utilisation. A compute process's event carries its ``gpu_instance_id`` and
``compute_instance_id`` when the GPU is in MIG mode (else nvidia-smi writes N/A, left out).

``nvidia-smi -q`` (text) is the same report as the XML, indented by four spaces a level under
``==============NVSMI LOG==============``, one ``GPU 00000000:3B:00.0`` block per GPU: it gives the same samples
and labels as the XML (``Utilization > Gpu``, ``FB Memory Usage > Used``, ``GPU Power Readings > Power Draw``,
``Temperature > GPU Current Temp``, ``Clocks > SM``, ``PCI > GPU Link Info > PCIe Generation / Link Width > Max /
Current``, ``PCI > Replays Since Reset``...; ``Driver Version``, ``CUDA Version``, ``VBIOS Version``). Not read from
the text: MIG devices and processes (use ``-q -x``). A line that is neither ``Key : value``, a section name, a GPU
line nor the banner is a ``ParseError``; so is text before the banner or ``Timestamp``.

Not checked: fields not listed above (skipped), that the units are the ones
nvidia-smi always prints (MiB, W, C, MHz, %, x for lanes). A CSV with
both ``power.draw`` and ``power.draw.instant`` gives one power sample (the instant one); a CSV
without ``index`` is a ParseError (a row's position is not its GPU in a log of repeated queries).
The XML is parsed with the standard library's expat, which fetches no external
entity (the file names a DTD we never load).
"""

from __future__ import annotations

import csv
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from xml.parsers import expat

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Sample
from hpcwatch.sources.lines import file_time, line_text, read_text
from hpcwatch.vocab import EventKind

_Path = str | os.PathLike[str]

__all__ = [
    "parse_nvidia_smi_xml",
    "read_nvidia_smi_xml",
    "parse_nvidia_smi_q",
    "read_nvidia_smi_q",
    "is_nvidia_smi_q",
    "parse_nvidia_smi_csv",
    "read_nvidia_smi_csv",
    "QUERY_FIELDS",
    "is_nvidia_smi_xml",
    "is_nvidia_smi_csv",
]

_MIB_BYTES = 1 << 20

#: --query-gpu field -> DCGM field name (both spellings nvidia-smi accepts).
QUERY_FIELDS = {
    "utilization.gpu": vocab.DCGM_FI_DEV_GPU_UTIL,
    "utilization.memory": vocab.DCGM_FI_DEV_MEM_COPY_UTIL,
    "memory.used": vocab.DCGM_FI_DEV_FB_USED,
    "memory.free": vocab.DCGM_FI_DEV_FB_FREE,
    "power.draw": vocab.DCGM_FI_DEV_POWER_USAGE,
    "power.draw.instant": vocab.DCGM_FI_DEV_POWER_USAGE,
    "temperature.gpu": vocab.DCGM_FI_DEV_GPU_TEMP,
    "temperature.memory": vocab.DCGM_FI_DEV_MEMORY_TEMP,
    "clocks.sm": vocab.DCGM_FI_DEV_SM_CLOCK,
    "clocks.current.sm": vocab.DCGM_FI_DEV_SM_CLOCK,
    "clocks.mem": vocab.DCGM_FI_DEV_MEM_CLOCK,
    "clocks.current.memory": vocab.DCGM_FI_DEV_MEM_CLOCK,
    "pcie.link.gen.current": vocab.DCGM_FI_DEV_PCIE_LINK_GEN,
    "pcie.link.gen.max": vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN,
    "pcie.link.width.current": vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH,
    "pcie.link.width.max": vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH,
}
#: --query-gpu field -> dcgm-exporter label.
#: Of two fields for one metric, the lower sorts first and wins: the XML reader also prefers the instant power
#: reading; ``power.draw`` is a 1 s average on Ampere and newer (nvidia-smi --help-query-gpu).
_CSV_PREFERENCE = {"power.draw.instant": -1}
_QUERY_LABELS = {
    "index": "gpu",
    "uuid": "UUID",
    "name": "modelName",
    "pci.bus_id": "pci_bus_id",
    "driver_version": vocab.DCGM_FI_DRIVER_VERSION,
}
#: dcgm-exporter label -> the XML element under <gpu> that gives it.
_GPU_LABELS = (("UUID", "uuid"), ("modelName", "product_name"), (vocab.DCGM_FI_DEV_VBIOS_VERSION, "vbios_version"))
#: XML element path under <gpu> -> DCGM field name; the first path present wins.
_XML_FIELDS = (
    ("utilization/gpu_util", vocab.DCGM_FI_DEV_GPU_UTIL),
    ("utilization/memory_util", vocab.DCGM_FI_DEV_MEM_COPY_UTIL),
    ("fb_memory_usage/used", vocab.DCGM_FI_DEV_FB_USED),
    ("fb_memory_usage/free", vocab.DCGM_FI_DEV_FB_FREE),
    ("gpu_power_readings/instant_power_draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("gpu_power_readings/power_draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("power_readings/power_draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("temperature/gpu_temp", vocab.DCGM_FI_DEV_GPU_TEMP),
    ("temperature/memory_temp", vocab.DCGM_FI_DEV_MEMORY_TEMP),
    ("clocks/sm_clock", vocab.DCGM_FI_DEV_SM_CLOCK),
    ("clocks/mem_clock", vocab.DCGM_FI_DEV_MEM_CLOCK),
    ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", vocab.DCGM_FI_DEV_PCIE_LINK_GEN),
    ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN),
    ("pci/pci_gpu_link_info/link_widths/current_link_width", vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH),
    ("pci/pci_gpu_link_info/link_widths/max_link_width", vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH),
    ("pci/replay_counter", vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER),
)
_READING_RE = re.compile(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?:%|MiB|W|C|MHz|KiB|GiB|x)?\s*\Z")
_MISSING = ("N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "Unknown Error", "")


def _reading(text: str | None, what: str, *, path: _Path, line: int | None) -> float | None:
    """``"77.88 W"`` -> 77.88; ``"N/A"`` -> None."""
    value = (text or "").strip()
    if value in _MISSING or value.startswith("[") or value.startswith("Requested functionality"):
        return None
    m = _READING_RE.match(value)
    if m is None:
        raise ParseError(f"{what} is not a reading", path=path, line=line, text=value)
    return float(m.group(1))


def _smi_time(text: str, fmt: str, utc_offset_s: float, *, path: _Path, line: int | None) -> float:
    try:
        return datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC).timestamp() - utc_offset_s
    except ValueError as err:
        raise ParseError("not an nvidia-smi timestamp", path=path, line=line, text=text) from err


# -- XML -------------------------------------------------------------------------------------


def _xml_tree(text: str, *, path: _Path) -> tuple[ET.Element, dict[ET.Element, int]]:
    """The document, and the line each element starts on (for error messages)."""
    parser = expat.ParserCreate()
    builder = ET.TreeBuilder()
    lines: dict[ET.Element, int] = {}

    def start(tag: str, attrs: dict[str, str]) -> None:
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(text, True)
        return builder.close(), lines
    except expat.ExpatError as err:
        raise ParseError(f"not XML: {expat.ErrorString(err.code)}", path=path, line=err.lineno) from err
    except (ValueError, AssertionError) as err:  # an empty document or an encoding expat refuses
        raise ParseError(f"not XML: {err or 'no element'}", path=path, line=1) from err


def _line(lines: dict[ET.Element, int], element: ET.Element | None) -> int | None:
    return None if element is None else lines.get(element)


def _gpu_xml(
    gpu: ET.Element, index: int, common: dict[str, str], t: float, lines: dict[ET.Element, int], *, path: _Path
) -> Iterator[Sample | Event]:
    labels = {"gpu": str(index), **common}
    for key, tag in _GPU_LABELS:
        if (value := (gpu.findtext(tag) or "").strip()) and value not in _MISSING:
            labels[key] = value
    if gpu.get("id"):
        labels["pci_bus_id"] = gpu.get("id", "")
    seen = set()
    for where, field in _XML_FIELDS:
        if field in seen or (node := gpu.find(where)) is None:
            continue
        reading = _reading(node.text, where, path=path, line=_line(lines, node))
        if reading is not None:
            seen.add(field)
            yield Sample(metric=field, labels=labels, t=t, value=reading)
    for mig in gpu.iterfind("mig_devices/mig_device"):
        yield from _mig_samples(mig, labels, t, lines, path=path)
    for proc in gpu.iterfind("processes/process_info"):
        yield _process_event(proc, labels, t, lines, path=path)


#: ``<mig_device>`` memory readings -> DCGM field (module docstring).
_MIG_FIELDS = (
    ("fb_memory_usage/used", vocab.DCGM_FI_DEV_FB_USED),
    ("fb_memory_usage/free", vocab.DCGM_FI_DEV_FB_FREE),
    ("fb_memory_usage/total", vocab.DCGM_FI_DEV_FB_TOTAL),
)
#: ``<mig_device>`` ids -> label.
_MIG_LABELS = (("gpu_instance_id", "GPU_I_ID"), ("compute_instance_id", "GPU_CI_ID"), ("index", "mig_device"))


def _mig_samples(
    mig: ET.Element, parent: dict[str, str], t: float, lines: dict[ET.Element, int], *, path: _Path
) -> Iterator[Sample]:
    """One MIG instance's memory samples, tied to its parent GPU by the parent's labels."""
    labels = dict(parent)
    for tag, label in _MIG_LABELS:
        value = (mig.findtext(tag) or "").strip()
        if value and value not in _MISSING:
            labels[label] = value
    if "GPU_I_ID" not in labels:
        raise ParseError("a <mig_device> without gpu_instance_id", path=path, line=_line(lines, mig))
    for where, field in _MIG_FIELDS:
        node = mig.find(where)
        reading = None if node is None else _reading(node.text, where, path=path, line=_line(lines, node))
        if reading is not None:
            yield Sample(metric=field, labels=labels, t=t, value=reading)


def _process_event(
    proc: ET.Element, labels: dict[str, str], t: float, lines: dict[ET.Element, int], *, path: _Path
) -> Event:
    def reading(tag: str) -> float | None:
        return _reading(proc.findtext(tag), tag, path=path, line=_line(lines, proc.find(tag)))

    used, pid = reading("used_memory"), reading("pid")
    attrs = {
        "host": labels.get("Hostname"),
        "gpu": labels["gpu"],
        "uuid": labels.get("UUID"),
        "pid": None if pid is None else int(pid),
        "type": (proc.findtext("type") or "").strip(),
        "process_name": (proc.findtext("process_name") or "").strip(),
        "used_memory_bytes": None if used is None else int(used * _MIB_BYTES),
    }
    for tag in ("gpu_instance_id", "compute_instance_id"):  # MIG mode only; N/A on a whole GPU
        if (value := reading(tag)) is not None:
            attrs[tag] = int(value)
    return Event(kind=EventKind.GPU_PROCESS, t=t, source="nvidia-smi", attrs=attrs)


def parse_nvidia_smi_xml(
    text: str,
    *,
    path: str | os.PathLike[str] = "<input>",
    hostname: str | None = None,
    t: float | None = None,
    utc_offset_s: float = 0.0,
) -> Iterator[Sample | Event]:
    """DCGM-named samples and ``gpu_process`` events of ``nvidia-smi -q -x``; ``t`` overrides its <timestamp>."""
    root, lines = _xml_tree(text, path=path)
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"not an nvidia-smi log (root <{root.tag}>)", path=path, line=_line(lines, root))
    if t is None:
        stamp = root.find("timestamp")
        if stamp is None or not (stamp.text or "").strip():
            raise ParseError("no <timestamp> and no time given", path=path, line=_line(lines, root))
        t = _smi_time(stamp.text or "", "%a %b %d %H:%M:%S %Y", utc_offset_s, path=path, line=_line(lines, stamp))
    common = {"Hostname": hostname} if hostname else {}
    if driver := (root.findtext("driver_version") or "").strip():
        common[vocab.DCGM_FI_DRIVER_VERSION] = driver
    if (cuda := (root.findtext("cuda_version") or "").strip()) and cuda not in _MISSING:
        common["cuda_version"] = cuda
    for index, gpu in enumerate(root.iterfind("gpu")):
        yield from _gpu_xml(gpu, index, common, t, lines, path=path)


def read_nvidia_smi_xml(
    path: str | os.PathLike[str], *, hostname: str | None = None, t: float | None = None
) -> Iterator[Sample | Event]:
    yield from parse_nvidia_smi_xml(read_text(path), path=path, hostname=hostname, t=t)


# -- -q text --------------------------------------------------------------------------------

#: ``nvidia-smi -q`` section path (``/``-joined, as indented) -> DCGM field name; the first path present wins.
_TEXT_FIELDS = (
    ("Utilization/Gpu", vocab.DCGM_FI_DEV_GPU_UTIL),
    ("Utilization/Memory", vocab.DCGM_FI_DEV_MEM_COPY_UTIL),
    ("FB Memory Usage/Used", vocab.DCGM_FI_DEV_FB_USED),
    ("FB Memory Usage/Free", vocab.DCGM_FI_DEV_FB_FREE),
    ("GPU Power Readings/Instantaneous Power Draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("GPU Power Readings/Power Draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("Power Readings/Power Draw", vocab.DCGM_FI_DEV_POWER_USAGE),
    ("Temperature/GPU Current Temp", vocab.DCGM_FI_DEV_GPU_TEMP),
    ("Temperature/Memory Current Temp", vocab.DCGM_FI_DEV_MEMORY_TEMP),
    ("Clocks/SM", vocab.DCGM_FI_DEV_SM_CLOCK),
    ("Clocks/Memory", vocab.DCGM_FI_DEV_MEM_CLOCK),
    ("PCI/GPU Link Info/PCIe Generation/Current", vocab.DCGM_FI_DEV_PCIE_LINK_GEN),
    ("PCI/GPU Link Info/PCIe Generation/Max", vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN),
    ("PCI/GPU Link Info/Link Width/Current", vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH),
    ("PCI/GPU Link Info/Link Width/Max", vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH),
    ("PCI/Replays Since Reset", vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER),
    ("PCI/Replays since reset", vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER),  # older drivers
)
#: dcgm-exporter label -> the ``nvidia-smi -q`` key under a GPU that gives it.
_TEXT_LABELS = (("UUID", "GPU UUID"), ("modelName", "Product Name"), (vocab.DCGM_FI_DEV_VBIOS_VERSION, "VBIOS Version"))
_BANNER = "==============NVSMI LOG=============="
_GPU_LINE_RE = re.compile(r"GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*\Z")
_KEY_VALUE_RE = re.compile(r"(?P<key>[^:]*?\S)\s*:(?:\s(?P<value>.*))?\Z")
_SECTION_RE = re.compile(r"[A-Za-z0-9][\w .()/+-]*\Z")


def _text_gpu(
    bus: str, fields: dict[str, tuple[str, int]], index: int, common: dict[str, str], t: float, *, path: _Path
) -> Iterator[Sample]:
    labels = {"gpu": str(index), **common, "pci_bus_id": bus}
    for key, name in _TEXT_LABELS:
        if (value := fields.get(name, ("", 0))[0].strip()) and value not in _MISSING:
            labels[key] = value
    seen = set()
    for where, field in _TEXT_FIELDS:
        if field in seen or where not in fields:
            continue
        text, line = fields[where]
        reading = _reading(text, where, path=path, line=line)
        if reading is not None:
            seen.add(field)
            yield Sample(metric=field, labels=labels, t=t, value=reading)


def _text_blocks(
    text: str, *, path: _Path
) -> tuple[dict[str, tuple[str, int]], list[tuple[str, dict[str, tuple[str, int]]]]]:
    """The header's ``Key : value`` pairs, and each GPU's bus id with its pairs keyed by section path."""
    header: dict[str, tuple[str, int]] = {}
    gpus: list[tuple[str, dict[str, tuple[str, int]]]] = []
    stack: list[tuple[int, str]] = []  # (indent, section name) of the sections the line is under
    started = False
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip()
        body = line.strip()
        if not body:
            continue
        if body == _BANNER:
            started = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        gpu = _GPU_LINE_RE.match(body) if indent == 0 else None
        pair = _KEY_VALUE_RE.match(body)
        if gpu is not None:
            gpus.append((gpu.group("bus"), {}))
            stack = []
            continue
        if not started and not (pair and pair.group("key") == "Timestamp"):
            raise ParseError(
                f"not nvidia-smi -q output (want {_BANNER} first)", path=path, line=number, text=line_text(raw)
            )
        started = True
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if pair is None:
            if _SECTION_RE.match(body) is None:
                raise ParseError("not an nvidia-smi -q line", path=path, line=number, text=line_text(raw))
            stack.append((indent, body))
            continue
        where = "/".join([*(name for _, name in stack), pair.group("key")])
        target = gpus[-1][1] if gpus else header
        target.setdefault(where, (pair.group("value") or "", number))
    return header, gpus


def parse_nvidia_smi_q(
    text: str,
    *,
    path: str | os.PathLike[str] = "<nvidia-smi -q>",
    hostname: str | None = None,
    t: float | None = None,
    utc_offset_s: float = 0.0,
) -> Iterator[Sample]:
    """DCGM-named samples of ``nvidia-smi -q`` text (see the module docstring); ``t`` overrides its Timestamp."""
    header, gpus = _text_blocks(text, path=path)
    if t is None:
        if "Timestamp" not in header:
            raise ParseError("no Timestamp and no time given", path=path, line=1)
        stamp, line = header["Timestamp"]
        t = _smi_time(stamp, "%a %b %d %H:%M:%S %Y", utc_offset_s, path=path, line=line)
    common = {"Hostname": hostname} if hostname else {}
    for key, label in (("Driver Version", vocab.DCGM_FI_DRIVER_VERSION), ("CUDA Version", "cuda_version")):
        if (value := header.get(key, ("", 0))[0].strip()) and value not in _MISSING:
            common[label] = value
    for index, (bus, fields) in enumerate(gpus):
        yield from _text_gpu(bus, fields, index, common, t, path=path)


def read_nvidia_smi_q(
    path: str | os.PathLike[str], *, hostname: str | None = None, t: float | None = None
) -> Iterator[Sample]:
    yield from parse_nvidia_smi_q(read_text(path), path=path, hostname=hostname, t=t)


def is_nvidia_smi_q(head: str) -> bool:
    return head.lstrip().startswith(_BANNER)


# -- CSV -------------------------------------------------------------------------------------


def _field_name(header: str) -> str:
    """``"power.draw [W]"`` -> ``"power.draw"``."""
    return header.split("[", 1)[0].strip()


def _csv_row(
    row: dict[str, str], common: dict[str, str], t: float | None, utc_offset_s: float, *, path: _Path, line: int
) -> Iterator[Sample]:
    labels = dict(common)
    for field, label in _QUERY_LABELS.items():
        if row.get(field, "").strip():
            labels[label] = row[field].strip()
    if t is None:
        if not row.get("timestamp", "").strip():
            raise ParseError("no timestamp column and no time given", path=path, line=line)
        t = _smi_time(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f", utc_offset_s, path=path, line=line)
    seen: set[str] = set()
    for field in sorted(row, key=lambda f: _CSV_PREFERENCE.get(f, 0)):
        metric = QUERY_FIELDS.get(field)
        if metric is None or metric in seen:
            continue
        reading = _reading(row[field], field, path=path, line=line)
        if reading is not None:
            seen.add(metric)  # one sample per metric, GPU and time: power.draw.instant before power.draw
            yield Sample(metric=metric, labels=labels, t=t, value=reading)


def parse_nvidia_smi_csv(
    text: str,
    *,
    path: str | os.PathLike[str] = "<input>",
    columns: Sequence[str] | None = None,
    hostname: str | None = None,
    t: float | None = None,
    utc_offset_s: float = 0.0,
) -> Iterator[Sample]:
    """DCGM-named samples of ``--query-gpu=... --format=csv[,noheader][,nounits]``.

    With ``noheader`` pass ``columns`` (the ``--query-gpu`` list); ``t`` overrides a ``timestamp`` column,
    and is needed when there is none.
    """
    yield from _parse_csv(
        text, path=path, columns=columns, hostname=hostname, t=t, utc_offset_s=utc_offset_s, fallback_t=None
    )


def _csv_fields(raw: str, *, path: _Path, line: int) -> list[str]:
    try:
        return next(csv.reader([raw], skipinitialspace=True), [])
    except csv.Error as err:
        raise ParseError(f"bad CSV: {err}", path=path, line=line, text=raw) from err


def _parse_csv(
    text: str,
    *,
    path: _Path,
    columns: Sequence[str] | None,
    hostname: str | None,
    t: float | None,
    utc_offset_s: float,
    fallback_t: float | None,
) -> Iterator[Sample]:
    lines = text.split("\n")
    first = 0
    if columns is None:
        while first < len(lines) and not lines[first].strip():
            first += 1
        if first == len(lines):
            return
        columns = [_field_name(c) for c in _csv_fields(lines[first], path=path, line=first + 1)]
        first += 1
        if not any(c in QUERY_FIELDS or c in _QUERY_LABELS for c in columns):
            raise ParseError("not an nvidia-smi --query-gpu header", path=path, line=first, text=lines[first - 1])
    if "index" not in columns:
        # nvidia-smi prints one row per GPU in index order for one query, but a log of repeated queries
        # (-l, -lms) or a filtered one (-i) breaks that order: the row is no GPU's identity. Refuse.
        raise ParseError(
            "no index column: add index to --query-gpu (the GPU of a row is not its position)",
            path=path,
            line=max(first, 1),
            text=lines[first - 1] if first else None,
        )
    common = {"Hostname": hostname} if hostname else {}
    for number in range(first, len(lines)):
        raw = lines[number]
        if not raw.strip():
            continue
        values = _csv_fields(raw, path=path, line=number + 1)
        if len(values) != len(columns):
            raise ParseError(f"{len(values)} values for {len(columns)} columns", path=path, line=number + 1, text=raw)
        if t is None and "timestamp" not in columns:
            t = fallback_t
        yield from _csv_row(dict(zip(columns, values)), common, t, utc_offset_s, path=path, line=number + 1)


def read_nvidia_smi_csv(
    path: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    hostname: str | None = None,
    t: float | None = None,
) -> Iterator[Sample]:
    """``parse_nvidia_smi_csv`` of a saved output; without a timestamp column, ``t`` defaults to the file's
    write time."""
    yield from _parse_csv(
        read_text(path),
        path=path,
        columns=columns,
        hostname=hostname,
        t=t,
        utc_offset_s=0.0,
        fallback_t=file_time(path),
    )


def is_nvidia_smi_xml(head: str) -> bool:
    return "<nvidia_smi_log" in head[:4096]


def is_nvidia_smi_csv(head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0]
    names = {_field_name(c) for c in first.split(",")}
    return bool(names & set(QUERY_FIELDS)) and bool(names & {"index", "uuid", "pci.bus_id", "name", "timestamp"})
