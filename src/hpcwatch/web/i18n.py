"""Languages of the web page: one catalogue per language, chosen per request.

Every word the page shows comes from ``en.yaml`` / ``fr.yaml`` (the interface)
and ``model/cards.yaml`` (the element cards); the page embeds the chosen
language's catalogue as JSON and the scripts look words up there, so no text
lives in JavaScript. Loading checks that both catalogues have the same keys:
a key missing in French fails at start-up rather than leaving English on a
French page.

Findings are titled in English by the detectors (``Finding.title``, what the CLI
and JSON show). The page titles them again in its own language: the catalogues hold
one template per rule id under ``finding.<rule>`` (``finding.rdma.traffic_no_job``),
filled by ``finding_text`` from the finding's evidence and target; numbers take a
format spec (``{peak_mb_s:.1f}``) and the language's decimal mark.

Choice, first match wins: ``?lang=fr|en``, the ``hpcwatch_lang`` cookie the
language switch sets, ``Accept-Language`` (RFC 9110 §12.5.4, q-values
honoured), then English.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from hpcwatch.errors import ConfigError
from hpcwatch.model.cards import LANGUAGES, load_cards

__all__ = [
    "Catalogue",
    "load_catalogue",
    "negotiate",
    "finding_text",
    "finding_key",
    "LANGUAGES",
    "DEFAULT_LANGUAGE",
    "LANG_COOKIE",
]

DEFAULT_LANGUAGE = "en"
LANG_COOKIE = "hpcwatch_lang"


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The interface words of one language, flat dotted keys, plus its element cards."""

    lang: str
    words: Mapping[str, str]
    cards: Mapping[str, Any]

    def __call__(self, key: str) -> str:
        """The text of ``key``; an unknown key is a programming error, said loudly."""
        try:
            return self.words[key]
        except KeyError:
            raise ConfigError(f"web catalogue {self.lang}: no key {key!r}") from None

    def page_document(self) -> dict[str, Any]:
        """What the page's scripts receive: every word and every card."""
        return {"lang": self.lang, "words": dict(self.words), "cards": self.cards}


@lru_cache(maxsize=len(LANGUAGES))
def load_catalogue(lang: str) -> Catalogue:
    if lang not in LANGUAGES:
        raise ConfigError(f"unknown language {lang!r} (known: {', '.join(LANGUAGES)})")
    words = {lang_: _flat(_read(lang_)) for lang_ in LANGUAGES}
    reference = set(words[DEFAULT_LANGUAGE])
    for other, found in words.items():
        if set(found) != reference:
            diff = sorted(reference.symmetric_difference(found))
            raise ConfigError(
                f"web catalogue {other}.yaml: keys differ from {DEFAULT_LANGUAGE}.yaml: {', '.join(diff[:8])}"
            )
    cards = load_cards().for_lang(lang)
    # A vector's name is written once, on its card.
    names = {f"vector.{vid}": card["name"] for vid, card in cards["vectors"].items()}
    return Catalogue(lang=lang, words={**words[lang], **names}, cards=cards)


def _read(lang: str) -> Mapping[str, Any]:
    name = f"{lang}.yaml"
    try:
        data = yaml.safe_load(resources.files("hpcwatch.web").joinpath(name).read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"web catalogue {name}: not YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"web catalogue {name}: expected a mapping")
    return data


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{full}."))
        else:
            out[full] = str(value)
    return out


def negotiate(*, forced: str | None, cookie: str | None, accept_language: str | None) -> str:
    """The language to answer in (see the module docstring for the order)."""
    for choice in (forced, cookie):
        if choice in LANGUAGES:
            return choice
    return _from_accept_language(accept_language or "")


def _from_accept_language(header: str) -> str:
    ranked: list[tuple[float, int, str]] = []
    for position, item in enumerate(header.split(",")):
        tag, _, params = item.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0  # a malformed weight counts as "not acceptable"
        primary = tag.strip().lower().split("-")[0]
        if primary in LANGUAGES and q > 0:
            ranked.append((-q, position, primary))
    return min(ranked)[2] if ranked else DEFAULT_LANGUAGE


# -- findings in the page's language ---------------------------------------------------------------------------


def finding_key(rule: str) -> str:
    """The catalogue key of a rule id's title template."""
    return f"finding.{rule}"


def finding_text(
    rule: str | None,
    evidence: Mapping[str, Any] | None,
    *,
    target: str | None = None,
    t: float | None = None,
    lang: str = DEFAULT_LANGUAGE,
) -> str | None:
    """A finding's title in ``lang``, from its rule's template; None for a rule the catalogues do not know
    (the caller then shows ``Finding.title``)."""
    words = load_catalogue(lang).words
    template = words.get(finding_key(rule or ""))
    if template is None:
        return None
    evidence = evidence or {}
    params: dict[str, Any] = {k: v for k, v in evidence.items() if isinstance(v, (str, int, float))}
    params["target"] = target
    derive = _DERIVED.get(rule.split(".")[0]) if rule else None
    if rule and derive is not None:
        params.update(derive(rule, evidence, t, lambda key: words[f"finding_part.{key}"]))
    return _Formatter(lang).vformat(template, (), params)


class _Formatter(string.Formatter):
    """``str.format`` that shows a missing value as ``?`` and writes numbers with the language's decimal mark."""

    def __init__(self, lang: str) -> None:
        self.comma = lang == "fr"

    def get_value(self, key: Any, args: Any, kwargs: Mapping[str, Any]) -> Any:
        value = kwargs.get(key) if isinstance(key, str) else None
        return "?" if value is None else value

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            text = format(value, format_spec)
            return text.replace(".", ",") if self.comma else text
        return format(str(value), "")


def _base(path: Any) -> str | None:
    return str(path).rsplit("/", 1)[-1] if path else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rdma(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    peak, ref, lustre = (
        _num(e.get("peak_bytes_per_s")),
        _num(e.get("reference_bytes_per_s")),
        _num(e.get("lustre_bytes_per_s")),
    )
    labels, parts = e.get("labels"), e.get("partitions")
    labels = labels if isinstance(labels, dict) else {}
    parts = parts if isinstance(parts, list) else []
    return {
        "peak_mb_s": peak / 1e6 if peak is not None else None,
        "peak_gb_s": peak / 1e9 if peak is not None else None,
        "lustre_gb_s": lustre / 1e9 if lustre is not None else None,
        "ratio": peak / max(ref, 1.0) if peak is not None and ref is not None else None,
        "port": labels.get("port"),
        "partitions": ", ".join(f"{p.get('name')}={p.get('pkey') or '?'}" for p in parts if isinstance(p, dict)),
    }


def _supply_chain(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    url = e.get("url")
    return {"url_base": str(url).split("#")[0] if url else None, "file": _base(e.get("path"))}


def _data_poisoning(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    reason = e.get("reason")
    known = ("sha256", "size", "not_in_manifest", "missing")
    jobs = e.get("jobs_running")
    return {
        "dataset": e.get("dataset") or part("dataset_unnamed"),
        "shard": _base(e.get("path")),
        "what": part(f"shard_{reason}") if reason in known else reason,
        "jobs": len(jobs) if isinstance(jobs, list) else None,
    }


def _gradient(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    return {"cause": part("cause_sdc" if e.get("hardware_events") else "cause_injection")}


def _remanence(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    used, base, end = _num(e.get("fb_used_mib")), _num(e.get("baseline_mib")), _num(e.get("job_end"))
    return {
        "held_mib": used - base if used is not None and base is not None else None,
        "after_s": t - end if t is not None and end is not None else None,
    }


def _container_escape(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    cmd = str(e.get("cmdline") or "").split()
    return {"process": _base(e.get("binary")) or (cmd[0] if cmd else None), "arguments": e.get("arguments") or ""}


def _weights(rule: str, e: Mapping[str, Any], t: float | None, part: Callable[[str], str]) -> dict[str, Any]:
    reader = e.get("user") or (f"uid {e['uid']}" if e.get("uid") is not None else None)
    return {"process": _base(e.get("binary")), "file": _base(e.get("path")), "reader": reader}


#: Values a template needs that the evidence holds only in another form (rates in B/s shown in MB/s ...),
#: by the rule id's family (the part before the dot).
_DERIVED: dict[str, Callable[[str, Mapping[str, Any], float | None, Callable[[str], str]], dict[str, Any]]] = {
    "rdma": _rdma,
    "supply_chain": _supply_chain,
    "data_poisoning": _data_poisoning,
    "gradient": _gradient,
    "remanence": _remanence,
    "container_escape": _container_escape,
    "weights": _weights,
}
