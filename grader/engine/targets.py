"""What gets graded: the learner's stub, the reference, any file with the kata's API, a
known-mistake variant built from source, or the namespace of a notebook."""
from __future__ import annotations

import hashlib
import linecache
import site
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from pathlib import Path

from grader import manifest


NOTEBOOK = "<notebook>"
_LIBRARY_PREFIXES = tuple(
    {str(manifest.PACKAGE_DIR), sys.prefix, sys.base_prefix, site.getusersitepackages(),
     sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)


class TargetLoadError(Exception):
    """The file to grade could not be imported; the message says why, for the learner."""


@dataclass
class Target:
    label: str  # how reports name it: "katas/03/gqa.py", "the reference", "mistake 'tiled repeat'"
    filename: str  # the code filename in tracebacks, used to tell learner frames from grader frames
    namespace: dict
    stopped: list = field(default_factory=list, compare=False, repr=False)  # functions that hung (grader.engine.hangs)

    def has(self, name: str) -> bool:
        return name in self.namespace

    def owns(self, filename: str) -> bool:
        """Whether code from ``filename`` is this target's (a learner frame, not the grader's)."""
        if self.filename != NOTEBOOK:
            return filename == self.filename
        return not (filename.startswith(_LIBRARY_PREFIXES) or filename.startswith("<frozen"))


def _module_name(tag: str) -> str:
    return "kvkata_target_" + hashlib.sha1(tag.encode()).hexdigest()[:12]


def from_source(source: str, filename: str, label: str) -> Target:
    """Execute ``source`` as a fresh module; ``filename`` shows in its tracebacks."""
    name = _module_name(filename + source)
    module = types.ModuleType(name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules[name] = module
    try:
        code = compile(source, filename, "exec")
        exec(code, module.__dict__)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise TargetLoadError(f"{label} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # the learner's module-level code failed
        sys.modules.pop(name, None)
        raise TargetLoadError(f"importing {label} raised {type(exc).__name__}: {exc}") from exc
    except BaseException:  # stopped from outside (a time limit): no half-made module stays behind
        sys.modules.pop(name, None)
        raise
    return Target(label=label, filename=filename, namespace=module.__dict__)


def from_path(path: Path, label: str | None = None) -> Target:
    path = Path(path).resolve()
    if not path.is_file():
        raise TargetLoadError(f"no file to grade at {path}")
    source = path.read_text(encoding="utf-8")
    return from_source(source, str(path), label or _relative(path))


def from_namespace(namespace: dict, label: str = "the notebook") -> Target:
    """Grade names defined in a live namespace (a notebook's globals)."""
    return Target(label=label, filename=NOTEBOOK, namespace=namespace)


def reference(kata: manifest.Kata) -> Target:
    return from_path(manifest.REPO_ROOT / kata.solution, label="the reference")


def stub(kata: manifest.Kata, root: Path | None = None) -> Target:
    return from_path((root or manifest.REPO_ROOT) / kata.stub)


def resolve(kata: manifest.Kata, spec: str, root: Path | None = None) -> Target:
    """``spec`` is "stub", "solution" or a path: a file, or a folder holding the kata's file
    as ``katas/NN/<file>``, ``NN/<file>`` or ``<file>``."""
    root = root or manifest.REPO_ROOT
    if spec == "stub":
        return stub(kata, root)
    if spec == "solution":
        return reference(kata)
    path = Path(spec).expanduser()
    if path.is_dir():
        for candidate in (path / kata.stub, path / kata.id / kata.file, path / kata.file):
            if candidate.is_file():
                return from_path(candidate)
        raise TargetLoadError(
            f"--kata-target={spec}: no {kata.file} for kata {kata.id} in that folder "
            f"(looked for {kata.stub}, {kata.id}/{kata.file} and {kata.file})"
        )
    if path.is_file():
        return from_path(path)
    raise TargetLoadError(f"--kata-target={spec}: no such file or folder")


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
