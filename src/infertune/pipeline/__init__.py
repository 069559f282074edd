"""The pipeline's stages, each in its own module, run in order by tune.py: the reference and
the verification inputs (reference.py), planning the order and the budget (planning.py),
preparing the candidates (preparing.py, the scheduler, with its parts: context.py, budget.py,
memory.py, tournament.py, offload.py and tf_worker.py, isolation.py and rehearsal_child.py),
verifying them (verifying.py), measuring them (measuring.py), selecting (selection.py) and the
diagnosis (diagnosis.py). Knows the backends and the result's values; never the faces above
it."""
