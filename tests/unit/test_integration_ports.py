"""The integration suite's fixed ports stay out of test_scale's twin ranges.

The session keeps each module's Prometheus and VictoriaMetrics running after the module ends, still
scraping their targets. When test_prometheus's exporter port (29977) lay inside test_scale's range, those
servers scraped one of test_scale's twin nodes: its scrape logs held points its own server never scraped,
and CI failed now and then. This reads the modules' port constants (``*_PORT``, ``PORT_*``), so a new
one placed in the range fails here, at once, rather than in one CI run out of several.
"""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATION = Path(__file__).parents[1] / "integration"


def _int_constants(path: Path) -> dict[str, int]:
    """Module-level ``NAME = 123`` and ``A, B = 1, 2`` assignments of ``path``."""
    found: dict[str, int] = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for name, value in zip(names, values):
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and type(value.value) is int:
                    found[name.id] = value.value
    return found


def _fixed_ports() -> dict[str, int]:
    """``module.NAME`` -> port, for every port constant of every integration module but test_scale's twin."""
    ports = {}
    for path in sorted(INTEGRATION.glob("*.py")):
        for name, value in _int_constants(path).items():
            if (name.endswith("PORT") or name.startswith("PORT_")) and (path.stem, name) != ("test_scale", "TWIN_PORT"):
                ports[f"{path.stem}.{name}"] = value
    return ports


def test_no_fixed_port_lies_in_test_scale_s_twin_ranges():
    scale = _int_constants(INTEGRATION / "test_scale.py")
    offset = _int_constants(INTEGRATION / "conftest.py")["VM_PORT_OFFSET"]
    first, last = scale["TWIN_PORT"], scale["TWIN_PORT"] + 2 * scale["NODES"]  # one range per backend
    ports = _fixed_ports()
    assert len(ports) >= 10, ports  # the reading found the suite's ports
    # A Prometheus port's VictoriaMetrics listens on +offset and its vmalert on +2 offset (conftest).
    inside = {
        name: port + k * offset for name, port in ports.items() for k in (0, 1, 2) if first <= port + k * offset < last
    }
    assert not inside, f"inside test_scale's twin ports {first}-{last - 1}: {inside}"
