"""Saved results: `Optimized.save(path)` writes one, `infertune.load(path)` restores it.

A saved result is a directory:

    manifest.json     format version, infertune version, backend name + kind + settings, the
                      sha256 of every other file, input signature, output structure and dtypes,
                      tuning options, environment and its fingerprint
    report.json       the Report of the optimize() run that chose it
    model.onnx | model.savedmodel/ | model.keras    what the chosen candidate runs
    batch-backends/N/ where candidates differ by tuned batch size: the artifact of each
                      other chosen candidate (the manifest's "batch_backends", and "by_batch"
                      saying which batch size runs which)
    exact-shapes/     where a candidate that runs only the sample's exact shapes serves calls
                      at those shapes (the manifest's "exact_backend", with the shapes); the
                      manifest's "backend" serves every other call

Nothing in it executes code when loaded: no pickle; a .keras file is loaded in Keras' safe
mode. load() refuses a directory whose files differ from the manifest (modified, missing or
added), and says plainly when this environment no longer fits the result (its runtime is
missing, the runtime cannot load the artifact, the CPU or runtime version changed).
Loading an ONNX Runtime or OpenVINO result does not import TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends import backend_class
from .backends.base import Backend
from .environment import collect_environment, differences, fingerprint
from .errors import ArtifactError, EnvironmentMismatchError, ExportError, OptionError, one_line
from .inputs import InputSignature
from .report import Report
from .structure import Structure
from .target import Target

if TYPE_CHECKING:
    from .optimized import Optimized

__all__ = ["FORMAT_VERSION", "MANIFEST", "REPORT", "load", "read_manifest", "save", "verify_files"]

FORMAT = "infertune-saved-result"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPORT = "report.json"
ON_MISMATCH = ("raise", "retune")
_REQUIRED = ("backend", "files", "inputs", "outputs", "options", "environment")


# -- save -------------------------------------------------------------------------------------
def save(opt: Optimized, path: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write `opt` as a saved result in the directory `path` (new, or empty); return the path.

    The files are written beside it first and moved into place at the end, so a failed or
    interrupted save leaves no half-written result. `extra` is merged into the manifest.
    """
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ExportError(
            f"Cannot save to '{path}': it exists and is not an empty directory. Choose a new "
            f"directory, or remove this one first."
        )
    backend = opt._backend
    for each in opt.backends:
        if backend_class(type(each).name) is not type(each):
            raise ExportError(
                f"The selected candidate {each.name!r} ({type(each).__qualname__}) is not one "
                f"of infertune's registered backends, so load() could not rebuild it. Register "
                f"its class in infertune.backends.BACKENDS, or choose a built-in candidate."
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    try:
        settings = _write_artifact(opt, backend, staging)
        others = _write_batch_backends(opt, staging)
        exact = _write_exact_backend(opt, staging)
        opt.report.to_json(staging / REPORT)
        manifest = {**_manifest(opt, backend, settings, _hash_files(staging)), **(extra or {})}
        if others:
            manifest["batch_backends"] = others
        if exact:
            manifest["exact_backend"] = exact
        if len(opt.backends_by_batch) > 1:
            manifest["by_batch"] = {str(n): name for n, name in opt.backends_by_batch.items()}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if path.exists():
            path.rmdir()  # empty, checked above
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _write_artifact(opt: Optimized, backend: Backend, directory: Path) -> dict:
    """The backend's files into `directory`; its settings. A loaded result copies its files."""
    if opt._saved_from is not None:
        source, manifest = opt._saved_from
        verify_files(source, manifest)
        for rel in manifest["files"]:
            if rel != REPORT:
                (directory / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / rel, directory / rel)
        return manifest["backend"]["settings"]
    return _save_backend(backend, directory)


def _write_batch_backends(opt: Optimized, directory: Path) -> list[dict]:
    """The artifacts of the candidates chosen at other batch sizes, one directory each;
    their manifest entries (a loaded result's are copied with its files)."""
    if opt._saved_from is not None:
        return opt._saved_from[1].get("batch_backends", [])
    entries = []
    for i, backend in enumerate(opt._general_backends()[1:]):
        sub = f"batch-backends/{i}"
        (directory / sub).mkdir(parents=True)
        entries.append(
            {**_backend_entry(backend, _save_backend(backend, directory / sub)), "dir": sub}
        )
    return entries


EXACT_DIR = "exact-shapes"


def _write_exact_backend(opt: Optimized, directory: Path) -> dict | None:
    """The artifact of the exact-shape fast path, if there is one, in its directory; its
    manifest entry, with the input shapes it serves (a loaded result's is copied)."""
    if opt._saved_from is not None:
        return opt._saved_from[1].get("exact_backend")
    if opt._exact is None:
        return None
    (directory / EXACT_DIR).mkdir()
    settings = _save_backend(opt._exact, directory / EXACT_DIR)
    return {
        **_backend_entry(opt._exact, settings),
        "dir": EXACT_DIR,
        "shapes": [list(shape) for shape in opt.input_signature.sample_shapes],
    }


def _backend_entry(backend: Backend, settings: dict) -> dict:
    return {
        "name": backend.name,
        "kind": type(backend).name,
        "precision": backend.precision,
        "requires": backend.requires,
        "settings": settings,
    }


def _save_backend(backend: Backend, directory: Path) -> dict:
    try:
        settings = backend.save_artifact(directory)
    except NotImplementedError as exc:
        raise ExportError(
            f"{exc}. Choose a candidate that can be saved (onnxruntime-cpu*, openvino-cpu*, "
            f"tf-function, tf-xla, keras-eager) with backends=[...]."
        ) from None
    except Exception as exc:
        raise ExportError(f"Saving the {backend.name} candidate failed: {one_line(exc)}") from exc
    json.dumps(settings)  # JSON-able, or a bug in the backend: fail here, not at load
    return settings


def _manifest(opt: Optimized, backend: Backend, settings: dict, files: dict) -> dict:
    from . import __version__

    if opt._saved_from is not None:  # measured where it was tuned, not where it was copied
        environment = opt._saved_from[1]["environment"]
    else:
        environment = opt.report.environment
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "infertune_version": __version__,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": opt.report.model,
        "backend": _backend_entry(backend, settings),
        "options": opt._options,
        "inputs": opt.input_signature.to_dict(),
        "outputs": {
            "structure": opt.output_structure.to_dict(),
            "dtypes": [np.dtype(d).name for d in opt.output_dtypes],
        },
        "files": files,
        "environment": environment,
        "fingerprint": fingerprint(environment),
    }


def _hash_files(directory: Path) -> dict:
    return {
        rel: {"sha256": _sha256(directory / rel), "bytes": (directory / rel).stat().st_size}
        for rel in _relative_files(directory)
    }


def _relative_files(directory: Path) -> list[str]:
    """Every file under `directory` but the manifest, as sorted POSIX relative paths."""
    files = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = (Path(root) / name).relative_to(directory).as_posix()
            if rel != MANIFEST:
                files.append(rel)
    return sorted(files)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- reading and checking ---------------------------------------------------------------------
def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a saved result, checked for format and version (not yet the files)."""
    from . import __version__

    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(
            f"No saved result at '{path}': expected a directory written by Optimized.save()."
        )
    file = path / MANIFEST
    if not file.is_file():
        raise ArtifactError(
            f"'{path}' has no {MANIFEST}, so it is not a result written by Optimized.save()."
        )
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{MANIFEST} in '{path}' is not valid JSON: {exc}.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(
            f"{MANIFEST} in '{path}' is not an infertune manifest (its format is "
            f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected "
            f"{FORMAT!r})."
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ArtifactError(f"{MANIFEST} in '{path}' has no valid format_version ({version!r}).")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"'{path}' was saved in format version {version} by infertune "
            f"{manifest.get('infertune_version')}; this infertune ({__version__}) reads format "
            f"versions up to {FORMAT_VERSION}. Upgrade it: pip install -U infertune."
        )
    missing = [key for key in _REQUIRED if key not in manifest]
    missing += [
        f"backend.{key}"
        for key in ("name", "kind", "settings")
        if key not in (manifest.get("backend") or {})
    ]
    if missing:
        raise ArtifactError(f"{MANIFEST} in '{path}' lacks {', '.join(missing)}.")
    _check_setting_paths(path, manifest)
    return manifest


def _check_setting_paths(path: Path, manifest: dict) -> None:
    """The files each backend's settings name ("file", "fixed_file", "dir") are among the
    hashed files."""
    files = manifest["files"]
    entries = [(manifest["backend"], "")]
    for entry in _entries(manifest)[1:]:  # the others, each in a directory of its own
        where = entry.get("dir")
        if not isinstance(where, str) or ".." in Path(where).parts:
            raise ArtifactError(f"{MANIFEST} in '{path}' names a bad directory: {where!r}.")
        entries.append((entry, f"{where}/"))
    for entry, prefix in entries:
        for key in ("file", "fixed_file", "dir"):
            value = entry["settings"].get(key)
            if value is None:
                continue
            value = prefix + value if isinstance(value, str) else value
            listed = (
                any(f.startswith(f"{value}/") for f in files) if key == "dir" else value in files
            )
            if not isinstance(value, str) or ".." in Path(value).parts or not listed:
                raise ArtifactError(
                    f"{MANIFEST} in '{path}' names a {key} the manifest does not list: {value!r}."
                )


def verify_files(path: Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its sha256, and no other file is."""
    root = path.resolve()
    listed = manifest["files"]
    for rel, meta in listed.items():
        file = (path / rel).resolve()
        if root not in file.parents:
            raise ArtifactError(f"{MANIFEST} in '{path}' names a file outside it: {rel!r}.")
        if not file.is_file():
            raise ArtifactError(
                f"'{rel}' is missing from '{path}' (the manifest lists it): the saved result is "
                f"incomplete. Save it again from the model."
            )
        digest = _sha256(file)
        if digest != meta.get("sha256"):
            raise ArtifactError(
                f"'{rel}' in '{path}' was modified after it was saved: its sha256 is "
                f"{digest[:16]}..., the manifest says {str(meta.get('sha256'))[:16]}... "
                f"infertune does not load modified artifacts; save the result again."
            )
    extra = [rel for rel in _relative_files(path) if rel not in listed]
    if extra:
        raise ArtifactError(
            f"'{extra[0]}' in '{path}' was not written by save() (the manifest does not list "
            f"it{f', nor {len(extra) - 1} other files' if len(extra) > 1 else ''}). infertune "
            f"does not load a result with added files; remove them or save the result again."
        )


# -- load -------------------------------------------------------------------------------------
def load(
    path: str | os.PathLike,
    *,
    model: Any = None,
    sample_input: Any = None,
    on_mismatch: str = "raise",
    verbose: bool = True,
) -> Optimized:
    """Restore a result saved with `Optimized.save(path)`: no tuning, no conversion.

    Args:
        path: the directory save() wrote.
        model, sample_input: the original model and a sample, needed only to re-tune.
        on_mismatch: what to do when this environment no longer fits the saved result (its
            runtime is missing or cannot load the artifact; the CPU, GPUs or runtime version
            differ from where it was tuned). "raise" (default): raise EnvironmentMismatchError
            where the result cannot run here, and warn where it runs but was tuned elsewhere.
            "retune": run optimize(model, sample_input) again with the saved options instead.
        verbose: progress on stderr while re-tuning.

    Raises:
        ArtifactError: a file was modified, added or removed; not a saved result; written by a
            newer infertune.
        EnvironmentMismatchError: the result cannot run here (with on_mismatch="raise").
    """
    if on_mismatch not in ON_MISMATCH:
        raise OptionError(
            f"on_mismatch must be one of {ON_MISMATCH}. Received: on_mismatch={on_mismatch!r}."
        )
    if on_mismatch == "retune" and (model is None or sample_input is None):
        raise OptionError(
            "on_mismatch='retune' needs the original model and a sample to tune again: pass "
            "model= and sample_input=."
        )
    start = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    name = manifest["backend"]["name"]
    entries = _entries(manifest)
    classes = []
    for entry in entries:
        cls = backend_class(entry["kind"])
        if cls is None:
            raise EnvironmentMismatchError(
                f"'{path}' was saved with the {entry['name']} candidate, which this infertune "
                f"does not know (saved by infertune {manifest.get('infertune_version')}). "
                f"Install that version, or tune again."
            )
        classes.append(cls)
    problem = next(filter(None, (_unavailable(c, e) for c, e in zip(classes, entries))), None)
    changes = [] if problem else _changes(classes, manifest)
    if on_mismatch == "retune" and (problem or changes):
        return _retune(manifest, model, sample_input, problem or "; ".join(changes), verbose)
    if problem:
        raise EnvironmentMismatchError(problem)
    try:
        opt = _restore(path, manifest, classes)
    except EnvironmentMismatchError as exc:
        if on_mismatch == "retune":
            return _retune(manifest, model, sample_input, str(exc), verbose)
        raise
    opt.report.notes.append(
        f"loaded from '{path}' in {time.perf_counter() - start:.2f} s (saved "
        f"{manifest.get('saved_at', '?')}); not tuned again"
    )
    if changes:
        words = "; ".join(changes)
        opt.report.notes.append(f"tuned in another environment: {words}")
        warnings.warn(
            f"The result in '{path}' ({name}) was tuned in another environment ({words}). It "
            f"runs and gives the same outputs, but another candidate may be faster here: pass "
            f"model=, sample_input= and on_mismatch='retune' to tune again.",
            UserWarning,
            stacklevel=2,
        )
    return opt


def _unavailable(cls: type[Backend], entry: dict) -> str | None:
    """Why a saved backend (its manifest entry) cannot run here, in words with the fix, or
    None."""
    name = entry["name"]
    reason = cls().available()
    if reason is None:
        return None
    extra = entry.get("requires")
    fix = f'pip install "infertune[{extra}]"' if extra else "install its runtime"
    return (
        f"The saved result uses the {name} candidate, which cannot run here: {reason}. "
        f"Install what it needs ({fix}), or pass model=, sample_input= and "
        f"on_mismatch='retune' to tune again among the candidates that run here."
    )


def _changes(classes: list[type[Backend]], manifest: dict) -> list[str]:
    packages = tuple(dict.fromkeys(p for cls in classes for p in cls.runtime_packages))
    current = collect_environment(packages)
    return differences(manifest["environment"], current, packages)


def _restore(path: Path, manifest: dict, classes: list[type[Backend]]) -> Optimized:
    from .optimized import Optimized

    signature = InputSignature.from_dict(manifest["inputs"])
    structure = Structure.from_dict(manifest["outputs"]["structure"])
    dtypes = [np.dtype(d) for d in manifest["outputs"]["dtypes"]]
    options = manifest["options"]
    entries = _entries(manifest)
    backends = {}
    for cls, entry in zip(classes, entries):
        # Each backend gets a target of its own: shared conversions are per artifact.
        target = Target(None, signature, structure, dtypes, options.get("objective", "latency"))
        where = path / entry["dir"] if "dir" in entry else path
        backends[entry["name"]] = _load_backend(cls, entry, where, target, manifest)
    report = Report.from_json(path / REPORT)
    by_batch = manifest.get("by_batch")
    exact = manifest.get("exact_backend")
    return Optimized(
        backends[manifest["backend"]["name"]],
        signature,
        structure,
        report,
        output_dtypes=dtypes,
        options=options,
        saved_from=(path, manifest),
        by_batch={int(n): backends[name] for n, name in by_batch.items()} if by_batch else None,
        exact=backends[exact["name"]] if exact else None,
    )


def _entries(manifest: dict) -> list[dict]:
    """The manifest entries of every backend the result runs: the general choice first, then
    those chosen at other batch sizes, then the exact-shape fast path."""
    exact = [manifest["exact_backend"]] if manifest.get("exact_backend") else []
    return [manifest["backend"], *manifest.get("batch_backends", []), *exact]


def _load_backend(
    cls: type[Backend], entry: dict, where: Path, target: Target, manifest: dict
) -> Backend:
    name = entry["name"]
    try:
        backend = cls.load_artifact(where, entry["settings"], target)
    except Exception as exc:  # the files are verified: what fails is this environment
        then = manifest["environment"].get("packages", {})
        versions = ", ".join(f"{p} {then.get(p) or 'absent'}" for p in cls.runtime_packages)
        raise EnvironmentMismatchError(
            f"The {name} artifact in '{where}' does not load here: {one_line(exc)}. It was "
            f"saved with {versions or 'its runtime'}; install those versions, or pass model=, "
            f"sample_input= and on_mismatch='retune' to tune again."
        ) from exc
    backend.name = name
    return backend


def _retune(manifest: dict, model: Any, sample_input: Any, reason: str, verbose: bool):
    from .api import optimize

    options = manifest["options"]
    opt = optimize(
        model,
        sample_input,
        backends=options.get("backends"),
        rtol=options["rtol"],
        atol=options["atol"],
        objective=options["objective"],
        precision=tuple(options["precision"]),
        batch_sizes=options.get("batch_sizes"),
        latency_budget_ms=options.get("latency_budget_ms"),
        verbose=verbose,
    )
    opt.report.notes.append(f"tuned again instead of loading the saved result: {reason}")
    return opt
