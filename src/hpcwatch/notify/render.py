"""Words and templates: a notice's text and HTML in the reader's language, from values a report returned.

Words live in ``en.yaml`` / ``fr.yaml`` beside this module (same keys, checked on load, as the web's
catalogues are); the advice and the findings' titles are worded by the web's catalogues
(``web.i18n``: ``advice.<key>``, ``finding.<rule>``), so a job's advice reads the same on its page
and in its mail. Templates are Jinja2 files under ``templates/`` (``<name>.txt.j2``, ``<name>.html.j2``),
rendered with ``StrictUndefined`` and, for HTML, autoescape; a ``templates`` folder of the config
replaces them by name, and each of its templates is checked at start against the fields its
context has (``TEMPLATE_FIELDS``): a template naming another field stops the start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml

from hpcwatch.errors import ConfigError
from hpcwatch.reports.text import visible

__all__ = ["Words", "words", "Renderer", "TEMPLATE_FIELDS", "check_templates", "fmt_num", "fmt_bytes", "fmt_time"]

LANGUAGES = ("en", "fr")
#: Each template's context: the only names a template may use.
TEMPLATE_FIELDS: dict[str, frozenset[str]] = {
    "job_end": frozenset(
        {"w", "lang", "subject", "intro", "footer", "link", "rows", "per_gpu", "steps", "findings", "advice", "missing"}
    ),
    "alert": frozenset({"w", "lang", "subject", "intro", "footer", "link", "rows"}),
    "digest": frozenset({"w", "lang", "subject", "intro", "footer", "link", "rows", "jobs", "advice"}),
}


class Words:
    """One language's words (flat dotted keys); ``w(key, **values)`` fills a template of them."""

    def __init__(self, lang: str, flat: Mapping[str, str]) -> None:
        self.lang, self.flat = lang, flat

    def __call__(self, key: str, **values: Any) -> str:
        try:
            text = self.flat[key]
        except KeyError:
            raise ConfigError(f"notify words {self.lang}: no key {key!r}") from None
        return text.format(**values) if values else text


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


@lru_cache(maxsize=len(LANGUAGES))
def words(lang: str) -> Words:
    if lang not in LANGUAGES:
        raise ConfigError(f"unknown language {lang!r} (known: {', '.join(LANGUAGES)})")
    found = {
        name: _flat(yaml.safe_load(resources.files("hpcwatch.notify").joinpath(f"{name}.yaml").read_text("utf-8")))
        for name in LANGUAGES
    }
    if set(found[lang]) != set(found["en"]):
        diff = sorted(set(found[lang]) ^ set(found["en"]))
        raise ConfigError(f"notify words {lang}.yaml: keys differ from en.yaml: {', '.join(diff[:8])}")
    return Words(lang, found[lang])


# -- numbers in the reader's language ------------------------------------------------------------------


def fmt_num(value: float | None, digits: int, lang: str, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.{digits}f}".replace(",", "\u202f" if lang == "fr" else ",")
    if lang == "fr":
        text = text.replace(".", ",")
    return f"{text} {unit}".rstrip() if unit else text


def fmt_bytes(n: float | None, lang: str) -> str:
    if n is None:
        return "-"
    units = ("B", "kB", "MB", "GB", "TB", "PB") if lang == "en" else ("o", "ko", "Mo", "Go", "To", "Po")
    value = float(n)
    for unit in units:
        if abs(value) < 1000 or unit == units[-1]:
            return fmt_num(value, 0 if unit == units[0] else 1, lang, unit)
        value /= 1000
    return "-"  # unreachable: the last unit returns


def fmt_time(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    total = int(round(s))
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{h:02d}:{m:02d}:{sec:02d}"


# -- templates ------------------------------------------------------------------------------------------


def _loader(folder: str) -> jinja2.BaseLoader:
    package = jinja2.PackageLoader("hpcwatch.notify", "templates")
    return jinja2.ChoiceLoader([jinja2.FileSystemLoader(folder), package]) if folder else package


class Renderer:
    """The text and HTML of a notice: ``render(name, lang, **context)`` -> (text, html)."""

    def __init__(self, folder: str = "") -> None:
        loader = _loader(folder)
        strict = jinja2.StrictUndefined
        # Plain-text mail: no HTML to escape (its data strings were made visible before).
        self._text = jinja2.Environment(autoescape=False, loader=loader, undefined=strict, keep_trailing_newline=True)
        self._html = jinja2.Environment(autoescape=True, loader=loader, undefined=strict, keep_trailing_newline=True)

    def render(self, name: str, lang: str, **context: Any) -> tuple[str, str]:
        extra = set(context) - TEMPLATE_FIELDS[name] | (TEMPLATE_FIELDS[name] - {"w", "lang"} - set(context))
        if extra:
            raise ValueError(f"template {name}: context fields {sorted(extra)} differ from TEMPLATE_FIELDS")
        values = {**context, "w": words(lang), "lang": lang}
        return (
            self._text.get_template(f"{name}.txt.j2").render(values),
            self._html.get_template(f"{name}.html.j2").render(values),
        )


def check_templates(folder: str) -> None:
    """``ConfigError`` when a template of ``folder`` does not parse, or names a field its context lacks."""
    if not folder:
        return
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"{folder}: templates: not a folder")
    env = jinja2.Environment(autoescape=True)
    for path in sorted(root.glob("*.j2")):
        name = path.name.split(".")[0]
        where = visible(path)
        if name not in TEMPLATE_FIELDS:
            raise ConfigError(
                f"{where}: not a notify template (known: {', '.join(f'{n}.txt.j2, {n}.html.j2' for n in TEMPLATE_FIELDS)})"
            )
        try:
            source = path.read_text(encoding="utf-8")
            names = jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as err:
            raise ConfigError(f"{where}:{err.lineno}: {visible(err.message)}") from err
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{where}: cannot read: {err}") from err
        unknown = sorted(names - TEMPLATE_FIELDS[name])
        if unknown:
            line = next(
                (
                    n
                    for n, text in enumerate(source.splitlines(), 1)
                    if re.search(rf"\b{re.escape(unknown[0])}\b", text)
                ),
                1,
            )
            raise ConfigError(
                f"{where}:{line}: names an unknown field {visible(unknown[0])!r} "
                f"(known: {', '.join(sorted(TEMPLATE_FIELDS[name]))})"
            )
