"""Scale a tuned result out with Ray: batch inference with Ray Data, online serving with Ray
Serve (Open Inference Protocol v2, as Triton speaks it). Install with
`pip install "infertune[ray]"`; `import infertune` alone never imports Ray.

    ds.map_batches(infertune.ray.Predictor, fn_constructor_kwargs={"path": "tuned/"},
                   batch_size=256, compute=ray.data.ActorPoolStrategy(size=4))
    serve.run(infertune.ray.deployment("tuned/", max_batch_size=32))

The deployment is a network endpoint and reads requests as an attacker may write them: a
body past `max_body_mb` (64 MiB) or decompressing past `max_decoded_mb` (64 MiB) gets HTTP
413, a request of more samples than `max_batch_size` gets 400, both naming the limit.
`infertune serve tuned/` runs the deployment on a local Ray from the command line.
See docs/deploy.md, "Scaling out" and "Limits".
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
    from ray import serve  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f'infertune.ray needs Ray Data and Ray Serve: pip install "infertune[ray]" ({exc}).'
    ) from exc

from .deploy.ray_data import Predictor
from .deploy.ray_serve import deployment

__all__ = ["Predictor", "deployment"]
