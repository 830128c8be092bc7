"""How far correct files err beyond the reference's own error: the measurement behind
``grader.engine.precision.REFERENCE_ERROR_FACTOR``.

    python tests/precision_study.py [FILE ...]     (default: every file of tests/independent/ and the wrong ones)

Every check of the file's kata runs on it with a context that, at each float comparison in float32,
float16 or bfloat16, also runs the reference in float64 on the rounded inputs and notes, per result
tensor, ``ratio = max(|got - exact| - floor) / E``: the file's error beyond the dtype's floor, in units
of the reference's own error ``E`` on that input. A correct file needs the factor at least as large as
its largest ratio; a less precise file should land far above it. Prints each file's largest ratio, the
check and the result it came from.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader import checks, grade, manifest  # noqa: E402
from grader.engine import Ctx, precision, run_check, targets  # noqa: E402


class StudyCtx(Ctx):
    """A context that measures every narrow float comparison before judging it as usual."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.worst: tuple[float, str, str] = (0.0, "", "")

    def compare(self, example, expected, got, what="", run=None):
        if run is not None and precision.exact_example(example) is not None:
            exact = self.exact(example, run, what)
            if exact is not None:
                self._note(expected, exact, got, "result")
        super().compare(example, expected, got, what, run)

    def _note(self, expected, exact, got, where):
        if isinstance(expected, torch.Tensor):
            if (expected.is_floating_point() and expected.dtype in precision.NARROW and isinstance(got, torch.Tensor)
                    and isinstance(exact, torch.Tensor) and got.shape == expected.shape == exact.shape
                    and got.dtype == expected.dtype and expected.numel()):
                error = precision.reference_error(expected, exact)
                x, g = exact.detach().cpu().double(), got.detach().cpu().double()
                rtol, atol = precision.floor(expected.dtype)
                beyond = float(((g - x).abs() - (atol + rtol * x.abs())).clamp(min=0).nan_to_num(float("inf")).max())
                ratio = 0.0 if beyond == 0 else (beyond / error if error > 0 else float("inf"))
                if ratio > self.worst[0]:
                    self.worst = (ratio, str(self.running), f"{where} ({expected.dtype}, E={error:.3g})")
        elif isinstance(expected, dict) and isinstance(got, dict) and isinstance(exact, dict):
            for key in expected:
                if key in got and key in exact:
                    self._note(expected[key], exact[key], got[key], key)
        elif isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and isinstance(exact, (list, tuple)):
            for i, (e, x, g) in enumerate(zip(expected, exact, got)):
                self._note(e, x, g, f"{where}[{i}]")


def study(path: Path) -> tuple[float, str, str, int]:
    kata = manifest.get(path.name[1:3])
    target = targets.resolve(kata, str(path))
    grade.single_thread()
    ctx = StudyCtx(target, targets.reference(kata), torch.device("cpu"))
    failed = sum(not run_check(check, ctx, (), 60.0).passed for check in checks.for_kata(kata.id).all)
    return (*ctx.worst, failed)


def main(argv: list[str]) -> int:
    here = ROOT / "tests" / "independent"
    files = [Path(a) for a in argv] or sorted(here.glob("k[0-9][0-9]_*.py")) + sorted((here / "wrong").glob("k*.py"))
    for path in files:
        ratio, check, where, failed = study(path)
        print(f"{path.name}: largest ratio {ratio:.3g}"
              + (f" in {check}, {where}" if check else "") + f"; {failed} check(s) fail", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
