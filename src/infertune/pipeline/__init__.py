"""The pipeline's stages, each in its own module, run in order by tune.py: the reference and
the verification inputs (reference.py), planning the order and the budget (planning.py),
preparing and verifying the candidates (preparing.py, with isolation.py, rehearsal_child.py
and tf_worker.py), measuring them (measuring.py), selecting (selection.py) and the diagnosis
(diagnosis.py). Knows the backends and the result's values; never the faces above it."""
