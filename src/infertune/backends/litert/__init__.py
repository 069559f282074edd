"""LiteRT (TFLite): the backend in float32 and its thread variants (backend.py), the pool of
interpreters each converted model runs on (pool.py), the int8 backends (int8.py), the
conversion to a flatbuffer (convert.py), its int8 forms (quantize.py), a large model's
conversion in a child process (child.py).

No imports here: the conversion registry (export/registry.py) imports convert.py and
quantize.py, and the backends import that registry."""
