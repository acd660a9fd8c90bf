"""Pure analyses: records or documented columnar batches in, frozen result dataclasses out.

Import the module you need (``hpcwatch.analysis.steps``, ``.attribution``...): the
package itself exports nothing, so importing one analysis never loads the others.
"""

__all__: list[str] = []
