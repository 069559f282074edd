"""The model and what describes it: loading and tracing (source.py), its input and output
signatures (model/inputs.py, model/outputs.py), nested structures (model/structure.py), the Target
candidates are
prepared on (model/target.py), the split of preprocessing (model/splitting.py), size rules
(model/sizes.py), and
the rule outputs are compared by (tolerance.py)."""
