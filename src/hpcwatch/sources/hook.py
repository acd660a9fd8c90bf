"""TEMPORARY shim until the readers branch lands (moves the hook reader here)."""
from hpcwatch.instrument.torch import is_hook_jsonl, read_hook_jsonl as _read

__all__ = ["is_hook_jsonl", "read_hook_jsonl"]


def read_hook_jsonl(path, *, on_bad_line=None):
    return _read(path)
