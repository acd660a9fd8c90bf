"""Element cards: what each part of the cluster is, how one watches it, what threatens it.

The schematic, the CLI and reports show the same words, so they live here, in
``cards.yaml``, once per language, and not in any view. Loading checks that the
two languages carry the same cards and the same fields, so a missing French
sentence is an error at load time, not an English string on a French page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from hpcwatch.errors import ConfigError
from hpcwatch.records import VECTOR_TABLE

__all__ = ["Cards", "load_cards", "parse_cards", "LANGUAGES", "SECTIONS", "CARDS_PATH"]

CARDS_PATH = "cards.yaml"
#: The languages every card is written in; the first is the fallback.
LANGUAGES: tuple[str, ...] = ("en", "fr")
#: Sections of the file and the fields every card of that section must have.
SECTIONS: Mapping[str, tuple[str, ...]] = {
    "elements": ("title", "what", "observe", "tools", "threats", "value", "cost", "risk", "owner"),
    "collectors": ("title", "watches", "tools", "what", "value", "cost", "owner"),
    # a vector's title is its number and name ("3 · RDMA blind spot"), the number from records.VECTOR_TABLE
    "vectors": ("name", "target", "how", "signals", "detection", "value", "cost", "risk", "owner"),
    "passerelles": ("title", "text"),
}


@dataclass(frozen=True, slots=True)
class Cards:
    """All cards: ``by_lang[lang][section][key][field] -> text``."""

    by_lang: Mapping[str, Mapping[str, Mapping[str, Mapping[str, str]]]]

    def card(self, section: str, key: str, lang: str) -> Mapping[str, str]:
        """One card's fields; raises ``ConfigError`` for an unknown section, key or language."""
        try:
            return self.by_lang[lang][section][key]
        except KeyError:
            raise ConfigError(f"no card {section}.{key} in language {lang!r}") from None

    def for_lang(self, lang: str) -> Mapping[str, Mapping[str, Mapping[str, str]]]:
        """Every section's cards in one language (what the page embeds)."""
        if lang not in self.by_lang:
            raise ConfigError(f"cards: unknown language {lang!r} (known: {', '.join(LANGUAGES)})")
        return self.by_lang[lang]


@lru_cache(maxsize=1)
def load_cards() -> Cards:
    """The packaged cards (read once per process)."""
    text = resources.files("hpcwatch.model").joinpath(CARDS_PATH).read_text(encoding="utf-8")
    return parse_cards(text, path=CARDS_PATH)


def parse_cards(text: str, *, path: str = "<cards>") -> Cards:
    """Cards from YAML text; every card must have every field of its section in every language."""
    try:
        root = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not YAML: {err}") from err
    if not isinstance(root, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    by_lang: dict[str, dict[str, dict[str, dict[str, str]]]] = {lang: {} for lang in LANGUAGES}
    for section, fields in SECTIONS.items():
        cards = root.get(section)
        if not isinstance(cards, dict) or not cards:
            raise ConfigError(f"{path}: {section}: missing or empty")
        for key, langs in cards.items():
            for lang in LANGUAGES:
                by_lang[lang].setdefault(section, {})[key] = _card(langs, lang, fields, f"{path}: {section}.{key}")
    unknown = set(root) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"{path}: unknown section(s): {', '.join(sorted(unknown))}")
    _title_vectors(by_lang, path)
    return Cards(by_lang=by_lang)


def _title_vectors(by_lang: dict[str, dict[str, dict[str, dict[str, str]]]], path: str) -> None:
    """Every drawn vector of records.VECTOR_TABLE has a card, and its title is its number and name."""
    numbers: dict[str, int] = {v.id: v.number for v in VECTOR_TABLE if v.number is not None}
    cards = by_lang[LANGUAGES[0]]["vectors"]
    if set(cards) != set(numbers):
        raise ConfigError(f"{path}: vectors: the cards must be those of records.VECTOR_TABLE: {sorted(numbers)}")
    for sections in by_lang.values():
        for vid, card in sections["vectors"].items():
            card["title"] = f"{numbers[vid]} · {card['name']}"


def _card(langs: object, lang: str, fields: tuple[str, ...], where: str) -> dict[str, str]:
    if not isinstance(langs, dict) or not isinstance(langs.get(lang), dict):
        raise ConfigError(f"{where}.{lang}: missing")
    card = langs[lang]
    missing = [f for f in fields if not isinstance(card.get(f), str) or not card[f].strip()]
    if missing:
        raise ConfigError(f"{where}.{lang}: missing field(s) {', '.join(missing)}")
    extra = set(card) - set(fields)
    if extra:
        raise ConfigError(f"{where}.{lang}: unknown field(s) {', '.join(sorted(extra))}")
    return {f: card[f] for f in fields}
