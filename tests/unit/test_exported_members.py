"""The public surface: every module declares __all__, and every name it declares exists."""

import importlib
import pkgutil

import hpcwatch


def _modules():
    for info in pkgutil.walk_packages(hpcwatch.__path__, prefix="hpcwatch."):
        if info.name.endswith("__main__"):
            continue  # running it starts the CLI
        yield info.name


def test_every_module_declares_its_public_names():
    missing, dangling = [], []
    for name in _modules():
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        if exported is None:
            missing.append(name)
            continue
        dangling.extend(f"{name}.{attr}" for attr in exported if not hasattr(module, attr))
    assert missing == []
    assert dangling == []


def test_the_package_exports_its_version():
    assert hpcwatch.__all__ == ["__version__"]
    assert hpcwatch.__version__.count(".") == 2
