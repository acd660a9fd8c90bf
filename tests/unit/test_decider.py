"""The Decider view's report (reports/decider.py) on a store of a known job mix, its scoping, and its route.

The mix, one hour (T0, T0 + 1 h] on node n1, samples every 60 s (each covers the minute before it):

    account  job  GPU  utilisation  energy         spans
    mix      A    0    100 %        500 W counter  a 10 s step every 10 s (1 rank)
    mix      B    1    50 %         —              —
    idle     C    2,3  0 %          —              —
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hpcwatch.access.principal import Principal
from hpcwatch.access.scope import Scope
from hpcwatch.analysis.mfu import compute_mfu
from hpcwatch.assess.evidence import ModelShape
from hpcwatch.errors import ConfigError
from hpcwatch.model import reference_cluster
from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.reports.decider import DAY_S, HOUR_S, bucket_edges, decider_report
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.reports.scoped import scoped_decider
from hpcwatch.store import Store
from hpcwatch.vocab import DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, EventKind
from hpcwatch.web.access import current_principal
from hpcwatch.web.app import create_app

T0 = 20_000 * DAY_S + HOUR_S  # 01:00 UTC: the job hour is one whole hourly bucket
STEP_S = 60.0
WATTS = 500.0
MODEL = ModelShape(params=407e6, layers=24, d_model=1024, seq=2048, tokens_per_step=8 * 2048)


def _job(job_id: str, account: str, gpus: tuple[int, ...]) -> Job:
    return Job(
        id=job_id,
        user=f"user-{job_id}",
        account=account,
        nodes=("n1",),
        gpus=len(gpus),
        gpus_by_node={"n1": gpus},
        start=T0,
        end=T0 + HOUR_S,
        state="COMPLETED",
    )


def _records() -> list:
    utilisation = {0: 100.0, 1: 50.0, 2: 0.0, 3: 0.0}
    out: list = [_job("A", "mix", (0,)), _job("B", "mix", (1,)), _job("C", "idle", (2, 3))]
    for k in range(1, int(HOUR_S / STEP_S) + 1):
        t = T0 + k * STEP_S
        for gpu, util in utilisation.items():
            out.append(Sample(metric=DCGM_FI_DEV_GPU_UTIL, labels={"Hostname": "n1", "gpu": str(gpu)}, t=t, value=util))
        # dcgm-exporter's energy counter is in mJ
        energy = Sample(
            metric=DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            labels={"Hostname": "n1", "gpu": "0"},
            t=t,
            value=k * STEP_S * WATTS * 1e3,
        )
        out.append(energy)
    out += [
        Span(job="A", rank=0, step=s, phase="forward", start=T0 + 10.0 * s, dur=10.0)
        for s in range(1, int(HOUR_S / 10) - 1)
    ]
    out += [
        Event(kind=EventKind.ASSESSMENT, t=T0 + 600, source="test", attrs={"tier": "Silver"}),
        Event(kind=EventKind.ASSESSMENT, t=T0 + 1800, source="test", attrs={"tier": "Gold"}),
    ]
    return out


@pytest.fixture(scope="module")
def store():
    st = Store(":memory:")
    st.add(_records())
    yield st
    st.close()


def _account(report, name):
    return next(s for s in report.accounts if s.account == name)


def test_utilisation_of_the_job_mix_is_busy_over_observed_gpu_hours(store):
    report = decider_report(store, window_s=DAY_S, price_per_gpu_hour=3.0)
    mix, idle = _account(report, "mix").total, _account(report, "idle").total
    assert mix.gpu_hours_allocated == pytest.approx(2.0) and idle.gpu_hours_allocated == pytest.approx(2.0)
    assert mix.gpu_hours_busy == pytest.approx(1.5)  # 1 h at 100 % + 1 h at 50 %
    assert mix.utilisation == pytest.approx(0.75) and mix.coverage == pytest.approx(1.0)
    assert idle.utilisation == 0.0 and "utilisation" not in idle.missing  # idle is a measured 0, not unknown
    assert mix.jobs == 2 and idle.jobs == 1
    assert [s.account for s in report.accounts] == ["idle", "mix"]  # equal hours: by name


def test_cost_is_allocated_hours_times_the_price(store):
    report = decider_report(store, window_s=DAY_S, price_per_gpu_hour=3.0, currency="EUR")
    assert _account(report, "mix").total.cost == pytest.approx(6.0)
    assert report.currency == "EUR" and "cost" not in report.missing


def test_without_a_price_cost_is_none_with_its_reason(store):
    report = decider_report(store, window_s=DAY_S)
    total = _account(report, "mix").total
    assert total.cost is None and "price" in total.missing["cost"] and "price" in report.missing["cost"]


def test_energy_is_the_counters_deltas_and_none_where_no_counter(store):
    report = decider_report(store, window_s=DAY_S)
    # 59 deltas of 60 s at 500 W in the one bucket: the first sample has no delta
    assert _account(report, "mix").total.energy_kwh == pytest.approx(59 * STEP_S * WATTS / 3.6e6)
    idle = _account(report, "idle").total
    assert idle.energy_kwh is None and idle.missing["energy_kwh"]


def test_goodput_is_the_goodput_reports_productive_share(store):
    report = decider_report(store, window_s=DAY_S)
    expected = goodput_report(store, "A")
    mix = _account(report, "mix")
    assert mix.total.goodput == pytest.approx(expected.productive_s / expected.total_s)
    assert 0.9 < mix.total.goodput < 1.0  # 10 s of start-up and 20 s of tail in an hour
    assert _account(report, "idle").total.goodput is None  # no steps recorded: unaccounted, not 0 %
    assert [b.goodput is not None for b in mix.buckets].count(True) == 1  # counted where its window ends


def test_mfu_needs_the_model_and_then_is_the_median_steps(store):
    assert _account(decider_report(store, window_s=DAY_S), "mix").total.mfu is None
    report = decider_report(store, window_s=DAY_S, model=MODEL, gpu="h200")
    expected = compute_mfu(
        params=MODEL.params,
        layers=24,
        d_model=1024,
        seq=2048,
        tokens_per_step=MODEL.tokens_per_step,
        step_time_s=10.0,
        gpus=1,
        gpu="h200",
    )
    assert _account(report, "mix").total.mfu == pytest.approx(expected.mfu)
    assert _account(report, "idle").total.mfu is None and "mfu" not in report.missing


def test_a_job_whose_steps_outrun_the_samples_counts_in_the_last_bucket(store):
    report = decider_report(store, window_s=DAY_S, until=T0 + HOUR_S / 2)  # A's steps run on past "until"
    mix = _account(report, "mix")
    assert mix.buckets[-1].goodput is not None and mix.total.goodput == mix.buckets[-1].goodput


def test_tiers_are_every_stored_assessment_oldest_first(store):
    tiers = decider_report(store, window_s=DAY_S).tiers
    assert [(p.tier, p.t) for p in tiers] == [("Silver", T0 + 600), ("Gold", T0 + 1800)]
    assert tiers[1].tier_number > tiers[0].tier_number


def test_buckets_are_hourly_for_a_day_and_add_up_to_the_window(store):
    report = decider_report(store, window_s=DAY_S)
    assert report.bucket_s == HOUR_S and len(report.edges) == 25
    mix = _account(report, "mix")
    busy = [b for b in mix.buckets if b.gpu_hours_busy is not None]
    assert len(busy) == 1 and busy[0].t1 == T0 + HOUR_S
    assert sum(b.gpu_hours_allocated for b in mix.buckets) == pytest.approx(mix.total.gpu_hours_allocated)


def test_days_start_at_utc_midnight():
    edges = bucket_edges(T0 - 2 * DAY_S, T0 + HOUR_S, DAY_S)
    assert edges[0] == T0 - 2 * DAY_S and edges[-1] == T0 + HOUR_S
    assert all(e % DAY_S == 0 for e in edges[1:-1]) and len(edges) == 4


@pytest.mark.parametrize(
    ("window_s", "bucket_s", "field"),
    [
        (DAY_S, 1.0, "bucket_s"),  # shorter than a scrape
        (366 * DAY_S, HOUR_S, "window_s / bucket_s"),  # 8,784 buckets
        (0.0, None, "window_s"),
    ],
)
def test_out_of_bounds_window_is_refused_naming_the_field(store, window_s, bucket_s, field):
    with pytest.raises(ConfigError, match=field):
        decider_report(store, window_s=window_s, bucket_s=bucket_s)


def test_a_decider_reads_pseudonyms_and_the_same_numbers(store):
    report = decider_report(store, window_s=DAY_S)
    decider = Scope(name="dora", permissions=frozenset({"aggregates"}), key=b"k" * 32)
    seen = scoped_decider(report, decider)
    assert {s.account for s in seen.accounts} == {decider.pseudonym("mix"), decider.pseudonym("idle")}
    assert [s.total for s in seen.accounts] == [s.total for s in report.accounts]
    coordinator = Scope(name="alice", permissions=frozenset({"jobs:own", "jobs:account"}), accounts=frozenset({"mix"}))
    assert [s.account for s in scoped_decider(report, coordinator).accounts] == ["mix"]


def _client(store: Store, role: str | None) -> TestClient:
    app = create_app(store, reference_cluster(), gpu_hour_price=2.0, currency="EUR")
    if role is not None:
        principal = Principal(name="dora", roles=frozenset({role}), via="proxy")  # type: ignore[arg-type]
        app.dependency_overrides[current_principal] = lambda: principal
    return TestClient(app)


def test_route_answers_each_scope_as_it_may_read(store):
    with _client(store, None) as local:
        doc = local.get("/api/decider", params={"window_s": DAY_S}).json()
    assert {a["account"] for a in doc["accounts"]} == {"mix", "idle"}
    mix = next(a for a in doc["accounts"] if a["account"] == "mix")
    assert mix["total"]["cost"] == pytest.approx(4.0) and len(mix["buckets"]) == len(doc["edges"]) - 1
    with _client(store, "decider") as decider:
        accounts = {a["account"] for a in decider.get("/api/decider", params={"window_s": DAY_S}).json()["accounts"]}
    assert accounts and all(a.startswith("u-") for a in accounts)
    with _client(store, "user") as user:
        assert user.get("/api/decider").status_code == 403


def test_route_refuses_a_bad_window_with_a_one_line_error(store):
    with _client(store, None) as client:
        too_many = client.get("/api/decider", params={"window_s": 300 * DAY_S, "bucket_s": 60})
        assert too_many.status_code == 400 and "buckets" in too_many.text
        assert client.get("/api/decider", params={"bucket_s": 1}).status_code == 422


def test_an_empty_store_answers_no_account_and_why():
    with _client(Store(":memory:"), None) as client:
        doc = client.get("/api/decider").json()
    assert doc["accounts"] == [] and "nothing to report" in doc["missing"]["accounts"]
