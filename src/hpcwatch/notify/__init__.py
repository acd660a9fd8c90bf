"""``hpcwatch notify``: notices to the people they concern — health verdicts, findings, job ends, digests.

``config`` the ``[notify]`` table; ``channels`` the one registry of channel kinds (``smtp``, ``webhook``,
``slack``); ``recipients`` who is concerned and at which address; ``compose`` what is new, formatted
from the reports; ``render`` words and templates; ``loop`` the ``Notifier`` (pending rows in the
store, deliveries, back-off, rate limit). A view-level layer: it formats what reports returned.
"""

__all__: list[str] = []
