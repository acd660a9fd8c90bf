"""Supply chain (PyPI): what a training image installed that it should not have.

A training image pulls hundreds of distributions; one poisoned name is enough to
run code on every GPU node (in December 2022 PyTorch nightly's dependency
``torchtriton`` was shadowed on PyPI by a package that uploaded SSH keys and
``/etc/passwd``, https://pytorch.org/blog/compromised-nightly-dependency/).
Checks, all offline, over ``pip_package`` / ``pth_file`` events (sources/pip.py):

    rule                          fires on
    supply_chain.osv_malicious    a name in an OSV ``MAL-`` record (OpenSSF malicious-packages)
    supply_chain.known_incident   a name/version of the built-in incident list below
    supply_chain.osv_vulnerable   a version inside an OSV record's ``versions`` or ``ranges``
    supply_chain.typosquat        a name one edit (or a separator) away from a popular ML package
    supply_chain.pth_exec         a ``.pth`` line that ``site`` executes at start-up
    supply_chain.vcs_install      a ``name @ git+...`` / ``file://`` / editable install
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from hpcwatch.records import Event, Finding, Severity
from hpcwatch.sources.osv import OsvDatabase
from hpcwatch.sources.pip import normalize_name
from hpcwatch.vocab import EventKind

__all__ = [
    "SupplyChainConfig",
    "KNOWN_INCIDENTS",
    "POPULAR_ML_PACKAGES",
    "Incident",
    "detect_supply_chain",
    "typosquat_of",
    "damerau_distance",
    "RULES",
]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = (
    "supply_chain.osv_malicious",
    "supply_chain.known_incident",
    "supply_chain.osv_vulnerable",
    "supply_chain.typosquat",
    "supply_chain.pth_exec",
    "supply_chain.vcs_install",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    summary: str
    url: str
    versions: tuple[str, ...] = ()
    """Affected versions; empty means every version of the name."""


#: Incidents we know without a feed, each with its public write-up.
KNOWN_INCIDENTS: dict[str, Incident] = {
    "torchtriton": Incident(
        summary="dependency confusion against PyTorch nightly (25-30 Dec 2022): the PyPI torchtriton "
        "exfiltrated host data",
        url="https://pytorch.org/blog/compromised-nightly-dependency/",
    ),
    "ultralytics": Incident(
        summary="compromised releases published through the project's CI (Dec 2024) shipped a crypto miner",
        url="https://blog.pypi.org/posts/2024-12-11-ultralytics-attack-analysis/",
        versions=("8.3.41", "8.3.42", "8.3.45", "8.3.46"),
    ),
}

#: Names typosquatters aim at: the ML stack of a training image plus the most downloaded PyPI
#: packages it pulls (https://hugovk.github.io/top-pypi-packages/).
POPULAR_ML_PACKAGES: frozenset[str] = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "pytorch-triton",
        "triton",
        "numpy",
        "scipy",
        "pandas",
        "transformers",
        "tokenizers",
        "datasets",
        "accelerate",
        "safetensors",
        "huggingface-hub",
        "deepspeed",
        "megatron-core",
        "tensorflow",
        "keras",
        "jax",
        "jaxlib",
        "flash-attn",
        "xformers",
        "sentencepiece",
        "bitsandbytes",
        "peft",
        "vllm",
        "wandb",
        "tensorboard",
        "einops",
        "scikit-learn",
        "matplotlib",
        "pillow",
        "requests",
        "urllib3",
        "pyyaml",
        "protobuf",
        "onnx",
        "onnxruntime",
        "setuptools",
        "nvidia-nccl-cu12",
        "nvidia-cudnn-cu12",
        "apex",
        "tiktoken",
        "timm",
        "lightning",
        "pytorch-lightning",
    }
)

#: Real, unrelated projects one edit away from a popular name.
_LEGIT_NEIGHBOURS: frozenset[str] = frozenset(
    {"scapy", "dataset", "numba", "pyaml", "tensorboardx", "torchdata", "torchtext", "jaxtyping"}
)

#: ``.pth`` files every environment carries, and how their one executable line starts: setuptools'
#: distutils shim, virtualenv's hook, namespace packages (``*-nspkg.pth``) and PEP 660 editable finders.
_KNOWN_PTH: tuple[tuple[str, str], ...] = (
    ("distutils-precedence.pth", "import os; var = 'SETUPTOOLS_USE_DISTUTILS'"),
    ("_virtualenv.pth", "import _virtualenv"),
    ("-nspkg.pth", "import sys, types, os;"),
    ("__editable__.", "import __editable___"),
)

_VCS = re.compile(r"^(git|hg|svn|bzr)\+|^file:|^https?://.*\.(zip|tar\.gz|whl)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class SupplyChainConfig:
    popular: frozenset[str] = POPULAR_ML_PACKAGES
    """Names a typosquat imitates."""
    allow_vcs: frozenset[str] = frozenset()
    """Normalised names allowed to come from a VCS or file (the team's own packages)."""
    min_squat_len: int = 5
    """Shorter names are too close to everything to compare."""


def detect_supply_chain(
    events: Iterable[Event], *, osv: OsvDatabase | None = None, config: SupplyChainConfig = SupplyChainConfig()
) -> list[Finding]:
    findings: list[Finding] = []
    for event in events:
        if event.kind == EventKind.PIP_PACKAGE:
            findings.extend(_check_package(event, osv, config))
        elif event.kind == EventKind.PTH_FILE and not _known_pth(event):
            findings.append(_pth_finding(event))
    return findings


def _check_package(event: Event, osv: OsvDatabase | None, config: SupplyChainConfig) -> list[Finding]:
    a = event.attrs
    name, version, image = a["name"], a.get("version"), a.get("image") or "image"
    norm = normalize_name(name)
    target = f"{image}:{name}" + (f"=={version}" if version else "")
    base = {"package": name, "version": version, "image": image, "source": event.source}
    out: list[Finding] = []

    def add(rule: str, severity: Severity, title: str, **extra: object) -> None:
        out.append(
            Finding(
                vector="supply_chain",
                severity=severity,
                target=target,
                title=title,
                evidence={**base, **extra},
                t=event.t,
                rule=rule,
            )
        )

    for entry in osv.matching(name, version) if osv else ():
        if entry.malicious:
            add(
                "supply_chain.osv_malicious",
                "critical",
                f"{name} is a known malicious package ({entry.id})",
                osv_id=entry.id,
                summary=entry.summary,
                aliases=list(entry.aliases),
            )
        else:
            add(
                "supply_chain.osv_vulnerable",
                "high",
                f"{name} {version} is vulnerable ({entry.id})",
                osv_id=entry.id,
                summary=entry.summary,
                aliases=list(entry.aliases),
            )
    incident = KNOWN_INCIDENTS.get(norm)
    if incident and (not incident.versions or version in incident.versions):
        add(
            "supply_chain.known_incident",
            "critical",
            f"{name} matches a known PyPI incident",
            summary=incident.summary,
            url=incident.url,
        )
    squatted = typosquat_of(norm, config)
    if squatted:
        add("supply_chain.typosquat", "high", f"{name} looks like a typosquat of {squatted}", imitates=squatted)
    url = a.get("url")
    if url and (a.get("editable") or _VCS.search(url)) and norm not in config.allow_vcs:
        add(
            "supply_chain.vcs_install",
            "medium",
            f"{name} installed from {url.split('#')[0]}, not an index",
            url=url,
            editable=bool(a.get("editable")),
        )
    return out


def _known_pth(event: Event) -> bool:
    name = event.attrs["path"].rsplit("/", 1)[-1]
    code = event.attrs["code"]
    return any(
        (name == known or (known.startswith(("-", "_")) and known in name)) and code.startswith(prefix)
        for known, prefix in _KNOWN_PTH
    )


def _pth_finding(event: Event) -> Finding:
    a = event.attrs
    return Finding(
        vector="supply_chain",
        severity="high",
        target=f"{a.get('image')}:{a['path']}",
        title=f"{a['path'].rsplit('/', 1)[-1]} runs code at every Python start-up",
        evidence={"path": a["path"], "line": a["line"], "code": a["code"], "image": a.get("image")},
        t=event.t,
        rule="supply_chain.pth_exec",
    )


def typosquat_of(norm: str, config: SupplyChainConfig = SupplyChainConfig()) -> str | None:
    """The popular name ``norm`` imitates, or None (itself popular, a known neighbour, or not close)."""
    if norm in config.popular or norm in _LEGIT_NEIGHBOURS or len(norm) < config.min_squat_len:
        return None
    squashed = norm.replace("-", "")
    for popular in sorted(config.popular):
        if squashed == popular.replace("-", ""):
            return popular  # separator games: "scikitlearn", "huggingfacehub", "flash_attn-"
        limit = 2 if len(popular) >= 10 else 1
        if abs(len(norm) - len(popular)) <= limit and damerau_distance(norm, popular) <= limit:
            return popular
    return None


def damerau_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]
