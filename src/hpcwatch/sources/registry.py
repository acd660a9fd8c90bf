"""The one table of formats: how each is recognised, which reader reads it, what it yields.

Every way in — ``hpcwatch ingest``, ``scan PATH``, ``steps``, ``whatif`` — asks this
module what a file is. A ``Format`` says:

    name        what ``--format`` takes
    sniff       Head (first 64 KiB as text, raw bytes, the name) -> is it this format?
    read        (path, ReadContext) -> what it yields (see ``yields``)
    yields      "records" (Sample/Event/Span/Job/Finding), "advisories" (an OsvDatabase),
                "manifest" (a ShardManifest), "trace" (a KinetoTrace), "op-table" (a pyarrow table)
    kinds       record kinds a "records" format can yield (``--format X`` on a file that yields
                none of them is an error, not an empty success)
    columns     optional fast path: (path, ctx) -> SAMPLE_SCHEMA tables, chunk by chunk
    folder      the format is a folder read as one input (site-packages, an OSV dump)
    uses_host   the reader takes the node from the context, since the file does not say it
    dated_by_file  records take the file's write time (so the same bytes at another time differ)

The first format whose sniff says yes wins: specific sniffs come first, lenient
ones (Prometheus text, pip freeze) last. Adding a format is a module in sources/
and one ``register(...)`` line below (docs/extending.md).

Files are opened through ``lines`` only: anything that is not a regular file after
following symlinks (FIFO, socket, device) is refused, folders are walked once each
(a symlink loop is not followed twice), hidden names (``.x``) are skipped.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hpcwatch.errors import ParseError

__all__ = [
    "Format",
    "Head",
    "ReadContext",
    "Input",
    "Skipped",
    "Yields",
    "register",
    "formats",
    "format_named",
    "detect",
    "plan_inputs",
    "pseudo_filesystem",
    "PSEUDO_FILESYSTEMS",
    "read_input",
    "read_head",
    "host_in_name",
    "SNIFF_BYTES",
    "RECORD_KINDS",
]

#: How much of a file the sniffers see.
SNIFF_BYTES = 64 * 1024
RECORD_KINDS = ("samples", "events", "spans", "jobs", "findings")

Yields = Literal["records", "advisories", "manifest", "trace", "op-table"]


@dataclass(frozen=True, slots=True)
class Head:
    """What a sniff sees of a file."""

    text: str
    """The first ``SNIFF_BYTES`` (gunzipped for ``.gz``), decoded leniently."""
    raw: bytes
    name: str
    is_dir: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadContext:
    """What a reader may need that the file itself does not say."""

    host: str | None = None
    """The node the file belongs to (from ``--host`` or a known node named in its path)."""
    on_bad_line: Callable[[ParseError], None] | None = None
    """For line-oriented logs: called with each bad line's error, reading goes on. None: the first bad line raises."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Format:
    name: str
    sniff: Callable[[Head], bool]
    read: Callable[[Path, ReadContext], Any]
    yields: Yields = "records"
    kinds: frozenset[str] = frozenset()
    columns: Callable[[Path, ReadContext], Iterator[Any]] | None = None
    folder: bool = False
    uses_host: bool = False
    dated_by_file: bool = False
    line_oriented: bool = False
    summary: str = ""

    def __post_init__(self) -> None:
        if self.yields == "records" and not self.kinds:
            raise ValueError(f"format {self.name!r}: a records format must name its kinds")
        if not set(self.kinds) <= set(RECORD_KINDS):
            raise ValueError(
                f"format {self.name!r}: unknown record kinds {sorted(set(self.kinds) - set(RECORD_KINDS))}"
            )


@dataclass(frozen=True, slots=True)
class Input:
    """One thing to read: a file (or a folder format) and what it is."""

    path: Path
    format: Format | None
    """None for an empty file."""
    context: ReadContext = field(default_factory=ReadContext)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A path a folder walk passed over, and why (reported, never silent)."""

    path: Path
    reason: str
    error: ParseError | None = None
    """Set when the path was passed over because it cannot be read (a file the walk cannot open, a
    sub-folder it cannot list): the walk goes on, and ``ingest`` reports the file as bad."""


_FORMATS: list[Format] = []


def register(fmt: Format, *, before: str | None = None) -> Format:
    """Add a format; ``before`` names one whose sniff must come after this one's."""
    if any(f.name == fmt.name for f in _FORMATS):
        raise ValueError(f"format {fmt.name!r} is registered twice")
    at = next((i for i, f in enumerate(_FORMATS) if f.name == before), len(_FORMATS)) if before else len(_FORMATS)
    _FORMATS.insert(at, fmt)
    return fmt


def formats() -> tuple[Format, ...]:
    _load_builtin()
    return tuple(_FORMATS)


def format_named(name: str) -> Format:
    for fmt in formats():
        if fmt.name == name:
            return fmt
    raise ParseError(f"unknown format {name!r} (known: {', '.join(f.name for f in formats())})")


# -- recognising ----------------------------------------------------------------------------------------------


def read_head(path: Path) -> Head:
    """The first ``SNIFF_BYTES`` of a regular file (only that much is gunzipped)."""
    from hpcwatch.sources.lines import read_head

    raw = read_head(path, SNIFF_BYTES)
    # A multi-byte character cut at the end of the head is not an error.
    return Head(text=raw.decode("utf-8", errors="ignore"), raw=raw, name=path.name)


def detect(path: Path, *, is_dir: bool = False) -> Format | None:
    """The format of ``path``: None for an empty file; ParseError when no format recognises it."""
    head = Head(text="", raw=b"", name=path.name, is_dir=True) if is_dir else read_head(path)
    if not is_dir and not head.raw.strip():
        return None
    for fmt in formats():
        if fmt.folder != is_dir:
            continue
        try:
            if fmt.sniff(head if not is_dir else _dir_head(path)):
                return fmt
        except (ValueError, IndexError, OSError):
            continue  # a sniffer that trips on odd text has simply not recognised it
    if is_dir:
        return None
    names = ", ".join(f.name for f in formats() if not f.folder)
    raise ParseError(f"unknown format (not one of: {names})", path=path, line=1)


def _dir_head(path: Path) -> Head:
    """A folder's sniff sees the names it holds (sorted), one a line, and the folder's own name."""
    names = sorted(p.name for p in path.iterdir())[:2000]
    return Head(text="\n".join(names), raw=b"", name=path.name, is_dir=True)


def host_in_name(path: Path, hosts: Iterable[str]) -> str | None:
    """A known node named in the file name (as a whole token), else in its folder's name."""
    ordered = sorted(set(hosts), key=len, reverse=True)
    for part in (path.name, path.parent.name):
        for host in ordered:
            if re.search(rf"(^|[^A-Za-z0-9]){re.escape(host)}([^A-Za-z0-9]|$)", part):
                return host
    return None


def read_input(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    host: str | None = None,
    on_bad_line: Callable[[ParseError], None] | None = None,
) -> Any:
    """What one file yields (records as an iterator, or the format's document); None for an empty file."""
    p = Path(path)
    kind = _kind(p)
    if kind not in ("file", "dir"):
        raise ParseError(kind, path=p)
    fmt = format_named(format) if format else detect(p, is_dir=kind == "dir")
    if fmt is None:
        return iter(()) if kind == "file" else None
    return fmt.read(p, ReadContext(host=host, on_bad_line=on_bad_line))


# -- walking --------------------------------------------------------------------------------------------------


def plan_inputs(
    paths: Iterable[str | os.PathLike[str]],
    *,
    format: str | None = None,
    hosts: Iterable[str] = (),
    host: str | None = None,
    on_bad_line: Callable[[ParseError], None] | None = None,
) -> Iterator[Input | Skipped]:
    """What to read under ``paths``, in order, each with its format and context.

    A path named on the command line must be readable and recognised (else ParseError);
    inside a walked folder, files no format recognises and special files are ``Skipped``
    with the reason, so one stray file does not stop a spool folder. Files a shard
    manifest of the same walk lists are training data, not input, and are skipped.
    """
    forced = format_named(format) if format else None
    hosts = tuple(hosts)
    seen: set[tuple[int, int]] = set()

    def context(p: Path) -> ReadContext:
        return ReadContext(host=host or host_in_name(p, hosts), on_bad_line=on_bad_line)

    for given in paths:
        p = Path(given)
        kind = _kind(p)
        if kind in ("dir", "file") and (pseudo := pseudo_filesystem(p)) is not None:  # a device says so itself
            raise ParseError(
                _refused_pseudo(pseudo) + "; copy a file out of it to read it (cp /proc/driver/nvidia/params node1/)",
                path=p,
            )
        if kind == "dir":
            yield from _walk(p, forced, context, seen, top=True)
        elif kind == "file":
            yield Input(p, forced or detect(p), context(p))
        else:
            raise ParseError(kind, path=p)


#: Kernel pseudo-filesystems: live kernel state, not saved files. A walk of them never ends well: /proc
#: holds a folder per process and thread, /proc/kcore is as large as the address space, /dev/zero and
#: /dev/urandom never end, a read of some /sys files has side effects. ``ingest /`` passes over them.
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


def pseudo_filesystem(p: Path) -> str | None:
    """The pseudo-filesystem ``p`` lies in ("/proc"), or None: by its real path (symlinks resolved), or by
    its device when the same file system is mounted elsewhere too (a container's /host/proc)."""
    real = os.path.realpath(p)
    for root in PSEUDO_FILESYSTEMS:
        if real == root or real.startswith(root + "/"):
            return root
    try:
        device = os.stat(p).st_dev
    except OSError:
        return None
    return _pseudo_devices().get(device)


@functools.cache
def _pseudo_devices() -> dict[int, str]:
    """The devices /proc, /sys and /dev are mounted on, those that are mounts of their own (in a chroot
    without them, /dev may be a plain folder of the root file system: that device is not refused).
    Asked once a process: mounts do not move under a walk."""
    devices: dict[int, str] = {}
    try:
        root = os.stat("/").st_dev
    except OSError:
        root = -1
    for path in PSEUDO_FILESYSTEMS:
        try:
            device = os.stat(path).st_dev
        except OSError:
            continue
        if device != root:
            devices.setdefault(device, path)
    return devices


def _refused_pseudo(root: str) -> str:
    return f"in {root}, a kernel pseudo-filesystem (live kernel state, not saved files): refused"


def _kind(p: Path) -> str:
    """ "file", "dir", or why the path cannot be read (symlinks are followed)."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "no such file or folder" if not os.path.islink(p) else "a symlink to nothing"
    except OSError as err:
        return f"cannot read: {err.strerror or err}"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    what = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    return f"{what}, not a regular file: refused"


def _walk(
    folder: Path,
    forced: Format | None,
    context: Callable[[Path], ReadContext],
    seen: set[tuple[int, int]],
    *,
    top: bool,
) -> Iterator[Input | Skipped]:
    try:
        st = os.stat(folder)
    except OSError as err:
        raise ParseError(f"cannot read: {err.strerror or err}", path=folder) from err
    if (st.st_dev, st.st_ino) in seen:
        yield Skipped(folder, "already walked (a symlink loop or a second link)")
        return
    seen.add((st.st_dev, st.st_ino))
    if _is_store(folder):
        yield Skipped(folder, "an hpcwatch store (its parts are not input)")
        return
    folder_format = (
        forced if forced is not None and forced.folder else (None if forced else detect(folder, is_dir=True))
    )
    if folder_format is not None:
        yield Input(folder, folder_format, context(folder))
        return
    try:
        children = sorted(c for c in folder.iterdir() if not c.name.startswith("."))
    except OSError as err:
        error = ParseError(f"cannot list the folder: {err.strerror or err}", path=folder)
        if top:
            raise error from err
        yield Skipped(folder, error.what, error=error)  # one unreadable sub-folder does not stop the walk
        return
    shards = _manifest_shards(children)
    for child in children:
        if child.resolve() in shards:
            yield Skipped(child, "a shard listed by the folder's manifest (training data, not input)")
            continue
        kind = _kind(child)
        # Only a folder or a symlink can lead into a pseudo-filesystem from a folder that is not one (a
        # device, /dev/zero linked here, is refused as a device below).
        leads_out = kind == "dir" or (kind == "file" and child.is_symlink())
        if leads_out and (pseudo := pseudo_filesystem(child)) is not None:
            yield Skipped(child, _refused_pseudo(pseudo))
        elif kind == "dir":
            yield from _walk(child, forced, context, seen, top=False)
        elif kind == "file":
            yield from _file_in_walk(child, forced, context)
        else:
            yield Skipped(child, kind)


def _is_store(folder: Path) -> bool:
    """An hpcwatch store (``store/core.py``): its manifest says so in its first bytes."""
    marker = folder / "manifest.json"
    try:
        with open(marker, "rb") as fh:
            return b'"hpcwatch-store/' in fh.read(4096)
    except OSError:
        return False


def _file_in_walk(
    child: Path, forced: Format | None, context: Callable[[Path], ReadContext]
) -> Iterator[Input | Skipped]:
    if forced is not None:
        yield Input(child, forced, context(child))
        return
    try:
        yield Input(child, detect(child), context(child))
    except ParseError as err:
        if err.what.startswith("unknown format"):
            yield Skipped(child, "no format recognises it")
        else:  # unreadable (no permission, a corrupt gzip header): named, and the walk goes on
            yield Skipped(child, err.what, error=err)


def _manifest_shards(children: list[Path]) -> set[Path]:
    manifest = next((c for c in children if c.name == "manifest.json" and c.is_file()), None)
    if manifest is None:
        return set()
    try:
        fmt = detect(manifest)
    except ParseError:
        return set()
    if fmt is None or fmt.yields != "manifest":
        return set()
    parsed = fmt.read(manifest, ReadContext())
    return {parsed.resolve(s).resolve() for s in parsed.shards}


# -- the formats ----------------------------------------------------------------------------------------------

_loaded = False


def _load_builtin() -> None:
    """Register the built-in formats once, on first use (so importing this module stays light)."""
    global _loaded
    if not _loaded:
        _loaded = True
        from hpcwatch.sources import builtin  # noqa: F401  (registers on import)
