"""The ``ib_port`` rule on ibstat output: a port not Active/LinkUp, or Active under the catalog's rate.

Real captures (tests/data/SOURCES.md): a ConnectX-3 from a linux-rdma bug report (IB port 1 Down/Polling,
Ethernet port 2 Down/Disabled) and the ArchWiki InfiniBand page's DDR card (port 1 Active at 20 Gb/s, port 2
Down/Polling); and ours, ibstat_two_cas.txt (mlx5_0 Active at 400, mlx5_1 Down/Polling)."""

from __future__ import annotations

import pytest

from hpcwatch.analysis.health import HealthConfig, health_report, passive_checks
from hpcwatch.sources.infiniband import parse_ibstat, read_ibstat
from hpcwatch.store import Store
from tests.conftest import DATA

IB = DATA / "infiniband"
LINUX_RDMA = IB / "ibstat_mlx4_ib_down_eth_disabled_linux_rdma.txt"
ARCHWIKI = IB / "ibstat_mlx4_ddr_active_and_polling_archwiki.txt"
TWO_CAS = IB / "ibstat_two_cas.txt"


def _report(samples, link="ndr", node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, link=link).node(node)


def _ports(node_health) -> dict[str, tuple[str, str]]:
    return {
        f"{c.evidence['device']}/{c.evidence['port']}": (c.verdict, c.title)
        for c in node_health.checks
        if c.rule == "ib_port" and c.verdict != "ok"
    }


def test_real_down_ib_port_drains_and_the_ethernet_port_is_not_judged() -> None:
    node = _report(read_ibstat(LINUX_RDMA, node="gpu07", t=10.0))
    assert node.verdict == "drain"
    assert _ports(node) == {"mlx4_0/1": ("drain", "IB port mlx4_0/1 is Down (Polling)")}  # port 2: Ethernet


def test_real_ddr_port_is_far_under_ndr_and_its_polling_port_is_down() -> None:
    node = _report(read_ibstat(ARCHWIKI, node="gpu07", t=10.0))
    ports = _ports(node)
    assert ports["mlx4_0/1"] == ("drain", "IB port mlx4_0/1 runs at 20 Gb/s, under InfiniBand NDR's 400")
    assert ports["mlx4_0/2"][0] == "drain"
    # against a DDR-era expectation the Active port is fine; the catalog has no DDR, so take HDR at 0.1 share
    cfg = HealthConfig(ib_rate_drain_fraction=0.1)
    checks = [
        c
        for c in passive_checks(_table(read_ibstat(ARCHWIKI, node="gpu07", t=10.0)), config=cfg, link="hdr")
        if c.evidence.get("port") == "1"
    ]
    assert [(c.verdict, c.evidence["rate_gbps"], c.evidence["link_gbps"]) for c in checks] == [("warn", 20.0, 200.0)]


def test_our_two_cas_one_up_at_ndr_one_down() -> None:
    node = _report(read_ibstat(TWO_CAS, node="gpu07", t=10.0))
    assert _ports(node) == {"mlx5_1/1": ("drain", "IB port mlx5_1/1 is Down (Polling)")}  # mlx5_0 at 400: fine


def test_three_down_ports_of_one_hca_are_not_ok() -> None:
    """Edited copy of the ArchWiki capture: a third port added, and port 1 set Down/Polling like port 2 (the
    edit is made here, in memory; the file is not changed)."""
    text = ARCHWIKI.read_text().replace("Number of ports: 2", "Number of ports: 3")
    text = text.replace("State: Active", "State: Down").replace("Physical state: LinkUp", "Physical state: Polling")
    text += text[text.index("        Port 2:") :].replace("Port 2:", "Port 3:")
    node = _report(parse_ibstat(text, node="gpu07", t=10.0))
    assert node.verdict == "drain"
    assert sorted(_ports(node)) == ["mlx4_0/1", "mlx4_0/2", "mlx4_0/3"]


def test_an_ndr_port_at_hdr_rate_warns_and_one_disabled_by_hand_warns() -> None:
    """Edited copy of ours: mlx5_0 at 200 (one speed step down); mlx5_1 Physical state Disabled."""
    text = (
        TWO_CAS.read_text()
        .replace("Rate: 400", "Rate: 200")
        .replace("Physical state: Polling", "Physical state: Disabled")
    )
    node = _report(parse_ibstat(text, node="gpu07", t=10.0))
    assert node.verdict == "warn"
    assert {k: v[0] for k, v in _ports(node).items()} == {"mlx5_0/1": "warn", "mlx5_1/1": "warn"}


def test_the_newest_state_of_a_port_wins() -> None:
    """The port came back: Down at t=10, Active at 400 at t=20 (our ibstat_two_cas with mlx5_1 brought up)."""
    up = (
        TWO_CAS.read_text()
        .replace("State: Down", "State: Active")
        .replace("Physical state: Polling", "Physical state: LinkUp")
    )
    up = up.replace("Rate: 10\n", "Rate: 400\n")
    node = _report([*read_ibstat(TWO_CAS, node="gpu07", t=10.0), *parse_ibstat(up, node="gpu07", t=20.0)])
    assert node.verdict == "ok" and any(c.rule == "ib_port" and c.verdict == "ok" for c in node.checks)


def test_bad_config_names_the_field() -> None:
    with pytest.raises(Exception, match="ib_rate_drain_fraction"):
        HealthConfig(ib_rate_drain_fraction=0.0)


def _table(samples):
    with Store(":memory:") as store:
        store.add(samples)
        return store.samples()


GPUD_IBPANIC = IB / "ibstat_a100_ibpanic_mlx5_8_gpud.txt"
AZURE_PASTED = IB / "ibstat_pasted_prompt_ibpanic_azhpc_diagnostics59.txt"


def test_real_ibpanic_on_a_vanished_hca_drains_the_node_naming_it() -> None:
    """gpud's real capture (ibstat exit 255): mlx5_0..7 Active at 200 (HDR), then ibpanic on mlx5_8. Before,
    the panic line was dropped and the node was ok."""
    node = _report(read_ibstat(GPUD_IBPANIC, node="gpu07", t=10.0), link="hdr")
    assert node.verdict == "drain"
    (check,) = [c for c in node.checks if c.rule == "ib_port" and c.verdict != "ok"]
    assert (
        check.title == "IB device mlx5_8 is gone (ibstat: stat of IB device 'mlx5_8' failed: No such file or directory)"
    )
    assert check.evidence["device"] == "mlx5_8"


def test_a_later_ibstat_listing_the_device_again_clears_it() -> None:
    gone = list(read_ibstat(GPUD_IBPANIC, node="gpu07", t=10.0))
    back = list(
        parse_ibstat(
            "CA 'mlx5_8'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 200\n"
            "\t\tLink layer: InfiniBand\n",
            node="gpu07",
            t=20.0,
        )
    )
    assert _report([*gone, *back], link="hdr").verdict == "ok"


def test_real_pasted_capture_with_prompts_is_read() -> None:
    """azhpc-diagnostics#59 as pasted: '~$ ibstat' (panics on the Accelerated Networking mlx5_an0), then
    '~$ ibstat mlx5_ib0' and its port, Initializing. Before: refused as an unknown format."""
    node = _report(read_ibstat(AZURE_PASTED, node="gpu07", t=10.0), link="hdr")
    found = {c.title for c in node.checks if c.rule == "ib_port" and c.verdict != "ok"}
    assert found == {
        "IB device mlx5_an0 is gone (ibstat: stat of IB device 'mlx5_an0' failed: No such file or directory)",
        "IB port mlx5_ib0/1 is Initializing (LinkUp)",
    }
