"""Languages of the web page: one catalogue per language, chosen per request.

Every word the page shows comes from ``en.yaml`` / ``fr.yaml`` (the interface)
and ``model/cards.yaml`` (the element cards); the page embeds the chosen
language's catalogue as JSON and the scripts look words up there, so no text
lives in JavaScript. Loading checks that both catalogues have the same keys:
a key missing in French fails at start-up rather than leaving English on a
French page.

Choice, first match wins: ``?lang=fr|en``, the ``hpcwatch_lang`` cookie the
language switch sets, ``Accept-Language`` (RFC 9110 §12.5.4, q-values
honoured), then English.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from hpcwatch.errors import ConfigError
from hpcwatch.model.cards import LANGUAGES, load_cards

__all__ = ["Catalogue", "load_catalogue", "negotiate", "LANGUAGES", "DEFAULT_LANGUAGE", "LANG_COOKIE"]

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
            raise ConfigError(f"web catalogue {other}.yaml: keys differ from {DEFAULT_LANGUAGE}.yaml: "
                              f"{', '.join(diff[:8])}")
    return Catalogue(lang=lang, words=words[lang], cards=load_cards().for_lang(lang))


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
