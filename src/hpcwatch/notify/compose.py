"""What is new, as notices: health verdicts warn/drain, findings of high severity and above, job ends, digests.

Each notice has a key that names what it is about, so the store's delivery rows tell whether it was
composed before (``store.queries.notice_keys``), whatever process composed it:

    health/<node>/<verdict>/<t>      t: the first verdict event of that run of verdicts (the episode's start)
    finding/<rule>/<target>/<t>      t: the finding's own time (its evidence)
    job-end/<id>
    act/<policy>/<episode>/<step>    a policy's warning or action (``hpcwatch act``, ``action_notice``)
    digest/<period>/user/<user>/<day> · digest/<period>/account/<account>/<day>   day: the period's first UTC day

Only candidates of the last ``lookback_s`` are looked at, keys first (cheap), and only the notices no
delivery row names are built (a job's report is computed once). This module formats what the
reports returned (``reports.jobpage.job_overview``, ``reports.digest.digests``); it computes no figure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from hpcwatch.analysis.attribution import ADVICE, JobReport, report_dict
from hpcwatch.notify.config import NotifyConfig
from hpcwatch.notify.message import Payload
from hpcwatch.notify.recipients import audience_recipients, user_address, user_language
from hpcwatch.notify.render import Renderer, fmt_bytes, fmt_duration, fmt_num, fmt_time, words
from hpcwatch.records import SEVERITIES, Finding
from hpcwatch.reports.digest import PERIODS, Digest, digests, last_period
from hpcwatch.reports.jobpage import JobOverview, job_overview
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.reports.text import visible
from hpcwatch.store import Store, queries
from hpcwatch.vocab import EventKind
from hpcwatch.web.i18n import finding_text, load_catalogue

__all__ = ["Candidate", "Addressed", "candidates", "action_notice"]

_ONE_LINE_MAX = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Addressed:
    """One rendered message for one audience: to a mail address, or (``address`` empty) for a webhook."""

    audience: str
    address: str
    payload: Payload


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    key: str
    kind: str
    t: float
    """UTC seconds of what it is about (the verdict, the finding, the job's end, the period's end)."""
    build: Callable[[], list[Addressed]]
    """The messages; called only for a key no delivery row names."""


def _v(text: object, limit: int = _ONE_LINE_MAX) -> str:
    """Data made visible (no CR/LF/ESC/bidi) and bounded: what a subject or a table cell may hold."""
    shown = visible("" if text is None else text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _visible_tree(value: Any) -> Any:
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible(k): _visible_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_visible_tree(v) for v in value]
    return value


class _Builder:
    def __init__(self, store: Store, config: NotifyConfig, renderer: Renderer) -> None:
        self.store, self.config, self.renderer = store, config, renderer

    def message(
        self,
        *,
        key: str,
        kind: str,
        template: str,
        audience: str,
        lang: str,
        subject: str,
        document: dict[str, Any],
        **context: Any,
    ) -> Payload:
        w = words(lang)
        text, html = self.renderer.render(template, lang, subject=subject, footer=w("footer"), **context)
        return Payload(
            notice=key,
            kind=kind,
            audience=audience,
            lang=lang,
            subject=_v(subject, 250),
            text=text,
            html=html,
            document=_visible_tree(document),
        )

    def for_roles(
        self, audiences: tuple[str, ...], make: Callable[[str, str], Payload], *, account: str | None = None
    ) -> list[Addressed]:
        """Per audience: one message for its webhooks (in the config's language), one per address (in the
        config's language, a coordinator Slurm names in their own)."""
        out = []
        for audience in audiences:
            payloads = {self.config.language: make(audience, self.config.language)}
            out.append(Addressed(audience=audience, address="", payload=payloads[self.config.language]))
            for address, lang in audience_recipients(self.config, audience, account=account):
                if lang not in payloads:
                    payloads[lang] = make(audience, lang)
                out.append(Addressed(audience=audience, address=address, payload=_to(payloads[lang], address)))
        return out


def _to(payload: Payload, address: str) -> Payload:
    return Payload(
        notice=payload.notice,
        kind=payload.kind,
        audience=payload.audience,
        lang=payload.lang,
        to=address,
        subject=payload.subject,
        text=payload.text,
        html=payload.html,
        document=payload.document,
    )


def candidates(
    store: Store, config: NotifyConfig, renderer: Renderer, *, now: float, job: str | None = None, mail_user: str = ""
) -> Iterator[Candidate]:
    """Every candidate notice of the look-back window (``job``: that job's end only, ``hpcwatch notify --job``)."""
    b = _Builder(store, config, renderer)
    if job is not None:
        yield _job_end(b, job, t=now, mail_user=mail_user)
        return
    since = now - config.lookback_s
    if "health" in config.kinds:
        yield from _health(b, since)
    if "finding" in config.kinds:
        yield from _findings(b, since)
    if "job_end" in config.kinds:
        for job_id in queries.ended_job_ids(store, since=since):
            yield _job_end(b, job_id, t=now)
    if "digest" in config.kinds:
        yield from _digests(b, now)


# -- health ---------------------------------------------------------------------------------------------


def _health(b: _Builder, since: float) -> Iterator[Candidate]:
    last: dict[str, str] = {}
    for event in b.store.events(EventKind.HEALTH_VERDICT, t0=since):
        node, verdict = str(event.attrs.get("node", "")), str(event.attrs.get("verdict", ""))
        previous = last.get(node)
        last[node] = verdict
        if verdict == previous or verdict not in b.config.health_verdicts or not node:
            continue
        start = (
            queries.verdict_episode_start(
                b.store, kind=EventKind.HEALTH_VERDICT, node=node, verdict=verdict, at=event.t
            )
            if previous is None
            else event.t
        )
        key = f"health/{node}/{verdict}/{start:.3f}"
        reason = str(event.attrs.get("reason", ""))
        yield Candidate(
            key=key,
            kind="health",
            t=start,
            build=partial(_health_messages, b, key, node, verdict, reason, start),
        )


def _health_messages(b: _Builder, key: str, node: str, verdict: str, reason: str, t: float) -> list[Addressed]:
    def make(audience: str, lang: str) -> Payload:
        w = words(lang)
        rows = [
            (w("label.node"), _v(node)),
            (w("label.verdict"), _v(verdict)),
            (w("label.reason"), _v(reason, 2000)),
            (w("label.when"), fmt_time(t)),
        ]
        return b.message(
            key=key,
            kind="health",
            template="alert",
            audience=audience,
            lang=lang,
            subject=w("subject.health", node=_v(node, 80), verdict=_v(verdict, 20)),
            document={"node": node, "verdict": verdict, "reason": reason, "t": t},
            intro=w("intro.health", node=_v(node, 80), verdict=_v(verdict, 20)),
            link="",
            rows=rows,
        )

    return b.for_roles(("operators",), make)


# -- findings -------------------------------------------------------------------------------------------


def _findings(b: _Builder, since: float) -> Iterator[Candidate]:
    floor = SEVERITIES.index(b.config.min_severity)
    for f in b.store.findings():
        if f.t < since or SEVERITIES.index(f.severity) < floor:
            continue
        key = f"finding/{f.rule}/{f.target}/{f.t:.3f}"
        yield Candidate(key=key, kind="finding", t=f.t, build=partial(_finding_messages, b, key, f))


def _finding_messages(b: _Builder, key: str, f: Finding) -> list[Addressed]:
    audiences = ("security", "operators") if f.severity == "critical" else ("security",)

    def make(audience: str, lang: str) -> Payload:
        w = words(lang)
        title = finding_text(f.rule, f.evidence, target=f.target, t=f.t, lang=lang) or f.title
        rows = [
            (w("label.severity"), _v(f.severity)),
            (w("label.rule"), _v(f.rule)),
            (w("label.target"), _v(f.target)),
            (w("label.when"), fmt_time(f.t)),
            ("", _v(title, 2000)),
        ]
        return b.message(
            key=key,
            kind="finding",
            template="alert",
            audience=audience,
            lang=lang,
            subject=w("subject.finding", severity=_v(f.severity, 20), target=_v(f.target, 80), title=_v(title, 120)),
            document={
                "vector": f.vector,
                "severity": f.severity,
                "rule": f.rule,
                "target": f.target,
                "title": title,
                "t": f.t,
            },
            intro=w("intro.finding", severity=_v(f.severity, 20)),
            link="",
            rows=rows,
        )

    return b.for_roles(audiences, make)


# -- job end ----------------------------------------------------------------------------------------------


def _job_end(b: _Builder, job_id: str, *, t: float, mail_user: str = "") -> Candidate:
    key = f"job-end/{job_id}"
    return Candidate(key=key, kind="job_end", t=t, build=lambda: _job_end_messages(b, key, job_id, mail_user))


def _advice(report: JobReport, lang: str) -> list[str]:
    catalogue = load_catalogue(lang).words
    return [
        _v(catalogue.get(f"advice.{k}", ADVICE.get(k, k)).format(**values), 1000) for k, values in report.advice_items
    ] or [_v(a, 1000) for a in report.advice]


def _job_rows(r: JobReport, lang: str) -> list[tuple[str, str]]:
    w = words(lang)
    pct = lambda v: "-" if v is None else fmt_num(v, 0, lang, "%")  # noqa: E731
    rss = ", ".join(f"{_v(n, 60)} {fmt_bytes(b, lang)}" for n, b in r.max_rss_bytes_by_node) or "-"
    return [
        (w("label.job"), _v(r.id)),
        (w("label.name"), _v(r.name or "-")),
        (w("label.user"), _v(r.user or "-")),
        (w("label.account"), _v(r.account or "-")),
        (w("label.partition"), _v(r.partition or "-")),
        (w("label.state"), _v(r.state or "-")),
        (w("label.nodes"), _v(",".join(r.nodes) or "-", 400)),
        (w("label.gpus"), str(r.gpus)),
        (w("label.start"), fmt_time(r.start)),
        (w("label.end"), fmt_time(r.end)),
        (w("label.elapsed"), fmt_duration(r.elapsed_s)),
        (w("label.time_limit_used"), pct(None if r.time_limit_used is None else 100 * r.time_limit_used)),
        (w("label.gpu_hours"), fmt_num(r.gpu_hours, 2, lang)),
        (w("label.gpu_util"), pct(r.mean_gpu_util)),
        (w("label.tensor_active"), "-" if r.mean_tensor_active is None else fmt_num(r.mean_tensor_active, 2, lang)),
        (w("label.max_gpu_memory"), fmt_bytes(r.max_fb_used_bytes, lang)),
        (w("label.cpu_util"), pct(r.cpu_util_pct)),
        (w("label.memory_requested"), fmt_bytes(r.memory_requested_bytes, lang)),
        (w("label.max_rss"), rss),
        (w("label.energy"), fmt_num(r.energy_kwh, 3, lang, "kWh")),
        (w("label.mean_power"), fmt_num(r.mean_power_w, 0, lang, "W")),
        (w("label.ib"), f"{fmt_bytes(r.ib_tx_bytes, lang)} / {fmt_bytes(r.ib_rx_bytes, lang)}"),
        (w("label.lustre"), f"{fmt_bytes(r.lustre_read_bytes, lang)} / {fmt_bytes(r.lustre_write_bytes, lang)}"),
        (w("label.xid"), str(r.xid_errors)),
    ]


def _step_rows(o: JobOverview, lang: str) -> list[tuple[str, str]]:
    w = words(lang)
    rows = []
    if o.steps is not None:
        s = o.steps
        rows.append((w("label.steps"), f"{s.first_step}–{s.last_step} ({s.steps})"))
        rows.append((w("label.step_time"), fmt_num(s.step_time_s, 3, lang, "s")))
        found = s.straggler
        rows.append(
            (
                w("label.straggler"),
                w("label.no_straggler")
                if found is None
                else _v(
                    f"rank {found['rank']} ({found['node']} GPU {found['gpu']}), {found['phase']} +{fmt_num(found['excess_s'], 3, lang, 's')}"
                ),
            )
        )
    if o.goodput is not None:
        g = o.goodput
        rows.append(
            (
                w("label.goodput"),
                w("label.goodput_line", pct=fmt_num(100 * g.goodput, 1, lang, "%"), total=fmt_duration(g.total_s)),
            )
        )
    return rows


def _job_end_messages(b: _Builder, key: str, job_id: str, mail_user: str) -> list[Addressed]:
    record = b.store.job(job_id)
    if record is not None and record.start is None:
        return []  # cancelled before it started: it used nothing (Slurm's own mail says it ended)
    # InputError when the store knows nothing of the job yet (an epilog before any poll): the loop leaves
    # it uncomposed, so the run that stores the job composes its report.
    # From the checkpoint the server's job pages left of a long job, when one is still true (nothing written).
    overview = job_overview(b.store, job_id, summary=True, kept=KeptStretches(on_disk=True, writes=False))
    r = overview.job
    user = r.user if r is not None else (record.user if record else None)
    account = r.account if r is not None else (record.account if record else None)
    stored = (record.mail_user if record is not None else None) or ""
    address = user_address(b.config, user, account, mail_user=mail_user or stored)
    lang = user_language(b.config, user)

    def make(audience: str, lang: str) -> Payload:
        w = words(lang)
        rows = _job_rows(r, lang) if r is not None else [(w("label.job"), _v(job_id))]
        per_gpu = (
            [
                {
                    "host": _v(g.host, 40),
                    "gpu": _v(g.device or g.gpu, 12),
                    "util": "-" if g.mean_util_pct is None else fmt_num(g.mean_util_pct, 0, lang, "%"),
                    "fb": fmt_bytes(g.max_fb_used_bytes, lang),
                }
                for g in r.per_gpu
            ]
            if r is not None
            else []
        )
        findings = [
            _v(f"{f.severity}: {finding_text(f.rule, f.evidence, target=f.target, t=f.t, lang=lang) or f.title}", 1000)
            for f in overview.findings
        ]
        state = (r.state if r is not None else None) or "-"
        name = (r.name if r is not None else None) or "-"
        document: dict[str, Any] = {
            "job": report_dict(r) if r is not None else {"id": job_id},
            "missing": dict(overview.missing),
        }
        if overview.goodput is not None:
            document["goodput"] = overview.goodput.goodput
        if overview.steps is not None:
            document["step_time_s"] = overview.steps.step_time_s
        return b.message(
            key=key,
            kind="job_end",
            template="job_end",
            audience=audience,
            lang=lang,
            subject=w("subject.job_end", id=_v(job_id, 40), name=_v(name, 60), state=_v(state, 30)),
            document=document,
            intro=w("intro.job_end", id=_v(job_id, 40)),
            link=f"{b.config.base_url.rstrip('/')}/job/{job_id}" if b.config.base_url else "",
            rows=rows,
            per_gpu=per_gpu,
            steps=_step_rows(overview, lang),
            findings=findings,
            advice=_advice(r, lang) if r is not None else [],
            missing=[_v(f"{part}: {why}", 300) for part, why in overview.missing.items()],
        )

    out = [Addressed(audience="user", address="", payload=make("user", b.config.language))]
    if address:
        out.append(Addressed(audience="user", address=address, payload=_to(make("user", lang), address)))
    return out


# -- digests -----------------------------------------------------------------------------------------------


def _digests(b: _Builder, now: float) -> Iterator[Candidate]:
    for period in PERIODS:
        if period not in b.config.digests:
            continue
        t0, t1 = last_period(period, now)
        day = fmt_time(t0)[:10]
        owners = queries.ended_job_owners(b.store, t0=t0, t1=t1)
        keys = {f"digest/{period}/user/{u}/{day}" for u, _ in owners if u}
        keys |= {f"digest/{period}/account/{a}/{day}" for _, a in owners if a}
        if not keys - queries.notice_keys(b.store, sorted(keys)):
            continue  # every digest of the period was composed: the jobs report is not computed again
        by_user, by_account = digests(b.store, period=period, t0=t0, t1=t1)
        for d in by_user:
            key = f"digest/{period}/user/{d.user}/{day}"
            yield Candidate(key=key, kind="digest", t=t1, build=partial(_digest_messages, b, key, d, day))
        for d in by_account:
            key = f"digest/{period}/account/{d.account}/{day}"
            yield Candidate(key=key, kind="digest", t=t1, build=partial(_digest_messages, b, key, d, day))


def _digest_messages(b: _Builder, key: str, d: Digest, day: str) -> list[Addressed]:
    who = d.user if d.user is not None else d.account

    def make(audience: str, lang: str) -> Payload:
        w = words(lang)
        which = "user" if d.user is not None else "account"
        rows = [
            (w("label.period"), f"{fmt_time(d.t0)} – {fmt_time(d.t1)}"),
            (w("label.jobs"), str(len(d.jobs))),
            (w("label.gpu_hours"), fmt_num(d.gpu_hours, 2, lang)),
            (w("label.gpu_util"), "-" if d.mean_gpu_util is None else fmt_num(d.mean_gpu_util, 0, lang, "%")),
            (w("label.energy"), fmt_num(d.energy_kwh, 3, lang, "kWh")),
        ]
        jobs = [
            {
                "id": _v(j.id, 20),
                "name": _v(j.name or "-", 24),
                "state": _v(j.state or "-", 11),
                "gpu_hours": fmt_num(j.gpu_hours, 2, lang),
                "util": "-" if j.mean_gpu_util is None else fmt_num(j.mean_gpu_util, 0, lang, "%"),
            }
            for j in d.jobs
        ]
        advice = [f"{_v(j.id, 20)}: {a}" for j in d.jobs for a in _advice(j, lang)]
        document = {
            "period": d.period,
            "t0": d.t0,
            "t1": d.t1,
            "user": d.user,
            "account": d.account,
            "gpu_hours": d.gpu_hours,
            "mean_gpu_util": d.mean_gpu_util,
            "energy_kwh": d.energy_kwh,
            "idle_gpus": d.idle_gpus,
            "jobs": [
                {"id": j.id, "gpu_hours": j.gpu_hours, "mean_gpu_util": j.mean_gpu_util, "advice": list(j.advice)}
                for j in d.jobs
            ],
        }
        subject_values = {
            "period": w(f"period.{d.period}"),
            "who": _v(who, 60),
            "day": day,
            "jobs": len(d.jobs),
            "gpu_hours": fmt_num(d.gpu_hours, 2, lang),
        }
        return b.message(
            key=key,
            kind="digest",
            template="digest",
            audience=audience,
            lang=lang,
            subject=w(f"subject.digest_{which}", **subject_values),
            document=document,
            intro=w(f"intro.digest_{which}", who=_v(who, 60)),
            link="",
            rows=rows,
            jobs=jobs,
            advice=advice,
        )

    if d.user is not None:
        address = user_address(b.config, d.user, None)
        lang = user_language(b.config, d.user)
        out = [Addressed(audience="user", address="", payload=make("user", b.config.language))]
        if address:
            out.append(Addressed(audience="user", address=address, payload=_to(make("user", lang), address)))
        return out
    return b.for_roles(("coordinators",), make, account=d.account)


# -- policies that act (hpcwatch act) ---------------------------------------------------------------------


def action_notice(
    store: Store,
    config: NotifyConfig,
    renderer: Renderer,
    *,
    key: str,
    t: float,
    topic: str,
    values: dict[str, Any],
    rows: list[tuple[str, Any]],
    document: dict[str, Any],
    audiences: tuple[str, ...] = ("operators",),
    user: str | None = None,
    account: str | None = None,
    mail_user: str = "",
) -> Candidate:
    """A notice of ``hpcwatch act`` (``topic``: ``act_warn``, ``act_done``, ``act_failed``: the words
    ``subject.<topic>`` / ``intro.<topic>``), to ``user`` (by mail, in the user's language) and ``audiences``.
    ``values`` fill the words; a value ``("act_verb", "hold")`` is a word of the reader's language. Data is
    made visible here, as every notice's."""
    b = _Builder(store, config, renderer)

    def make(audience: str, lang: str) -> Payload:
        w = words(lang)
        filled = {k: w(f"{v[0]}.{v[1]}") if isinstance(v, tuple) else _v(v, 120) for k, v in values.items()}
        return b.message(
            key=key,
            kind="action",
            template="alert",
            audience=audience,
            lang=lang,
            subject=w(f"subject.{topic}", **filled),
            document=document,
            intro=w(f"intro.{topic}", **filled).replace("  ", " "),  # a sentence left empty (act_if_refused)
            link="",
            rows=[(w(label) if label.startswith("label.") else _v(label), _v(value, 2000)) for label, value in rows],
        )

    def build() -> list[Addressed]:
        out = b.for_roles(audiences, make)
        if user:
            address = user_address(config, user, account, mail_user=mail_user)
            if address:
                out.append(
                    Addressed(
                        audience="user",
                        address=address,
                        payload=_to(make("user", user_language(config, user)), address),
                    )
                )
        return out

    return Candidate(key=key, kind="action", t=t, build=build)
