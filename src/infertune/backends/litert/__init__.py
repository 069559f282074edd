"""LiteRT (TFLite): the backend and its interpreter pool (backend.py), the conversion to a
flatbuffer and its int8 forms (convert.py), a large model's conversion in a child process
(child.py)."""
