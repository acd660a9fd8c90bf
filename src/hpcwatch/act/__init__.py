"""``hpcwatch act``: policies that act on what the health rules found, each off by default, every step audited.

``config`` the ``[act]`` table; ``runner`` the one way a Slurm command runs (argv, timeout); ``audit`` the
``act_action`` / ``act_undo`` events (who, what, why, evidence, undo); ``idle`` policy 1 (allocated GPUs left
idle: warn, then hold or cancel; a hold Slurm refuses: told, then ``fallback``); ``remediate`` policy 2 (a node
hpcwatch drained: the operators warned, then tested through a reservation, resumed when it passes); ``loop`` the ``Actor`` (``run_once``, ``undo``). A view-level layer like ``notify``, whose
channels and once-only notice keys carry its warnings: it reads reports and the store and runs commands.
"""

__all__: list[str] = []
