"""Code that runs inside the training job: the PyTorch step hook (``instrument.torch``), the shard verifier.

Nothing here imports torch at import time; ``hpcwatch.instrument.torch`` imports it
when a recorder is made and says how to install it when it is missing.
"""

__all__: list[str] = []
