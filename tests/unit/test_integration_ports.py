"""The integration tests run four at a time (scripts/test: pytest-xdist, ``--dist loadgroup``): a port two modules
both bind would fail one of them now and then, depending on which ran beside which. Every fixed port a module
declares must therefore be its own, counting what each port brings with it: a VictoriaMetrics at +100 and its
vmalert at +200 where the module runs both PromQL backends, one port per node for a twin's endpoints. (When
test_prometheus's exporter port lay inside test_scale's twin range, its servers scraped one of those nodes and
CI failed now and then.)"""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
VM_OFFSETS = (100, 200)
"""conftest.py's VM_PORT_OFFSET: VictoriaMetrics at a Prometheus port + 100, its vmalert at + 200."""


def _declared_ports(tree: ast.Module) -> dict[str, int]:
    """Module-level ``NAME = 29090`` and ``A, B = 1, 2`` where the name says PORT (offsets under 1024 are not)."""
    found: dict[str, int] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (
            zip(target.elts, value.elts, strict=False)
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
            else [(target, value)]
        )
        for name, constant in pairs:
            is_port = isinstance(name, ast.Name) and "PORT" in name.id
            value = constant.value if isinstance(constant, ast.Constant) else None
            if is_port and isinstance(value, int) and value >= 1024:
                found[name.id] = value
    return found


def _nodes(tree: ast.Module) -> int:
    """A module's NODES constant (a twin that size), else the 2-node twin every other test serves."""
    for node in tree.body:
        named_nodes = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "NODES" for t in node.targets
        )
        if named_nodes and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            return node.value.value * 2  # test_scale: one twin per backend, side by side
    return 2


def _reach(path: Path) -> dict[int, str]:
    text = path.read_text()
    tree = ast.parse(text)
    both_backends = "start_promql" in text
    ports: dict[int, str] = {}
    for name, port in _declared_ports(tree).items():
        if "TWIN" in name:
            spread = range(port, port + _nodes(tree))
        else:
            spread = [port, *(port + o for o in VM_OFFSETS)] if both_backends else [port]
        for p in spread:
            ports[p] = f"{path.name}:{name}"
    return ports


def test_no_two_integration_modules_bind_the_same_port():
    owner: dict[int, str] = {}
    clashes = []
    for path in sorted(INTEGRATION.glob("*.py")):
        for port, who in _reach(path).items():
            if port in owner and owner[port].split(":")[0] != path.name:
                clashes.append((port, owner[port], who))
            owner.setdefault(port, who)
    assert clashes == []


def test_the_port_reader_sees_the_ports_it_must():
    """The check above is only as good as what it reads: the known ports are found, offsets included."""
    conftest = _reach(INTEGRATION / "conftest.py")
    assert conftest[29090] == "conftest.py:PROMETHEUS_PORT" and conftest[29190].endswith("PROMETHEUS_PORT")
    assert conftest[29401] == "conftest.py:TWIN_PORT"  # the 2-node twin's second node
    rules = _reach(INTEGRATION / "test_recording_rules.py")
    assert {29095, 29096, 29097, 29195} <= set(rules)
    assert len([p for p in _reach(INTEGRATION / "test_scale.py") if p >= 30200]) == 256
