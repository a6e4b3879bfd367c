"""One doctor finding and how findings name readers and numbers: shared by doctor.py (config
findings), family_doctor.py (engine bugs in the families people extend now) and gguf_doctor.py
(a GGUF's rope keys)."""

from __future__ import annotations

from dataclasses import dataclass

from . import measured, readers


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str          # error: a reader runs another rope than meant; warning: a trap
    message: str
    engines: tuple[str, ...]
    off: str               # how far off each reader is, re-derived
    fix: str

    def lines(self) -> list[str]:
        return [f"[{self.code}] {self.severity}: {self.message}",
                f"    affects: {', '.join(self.engines)}", f"    off: {self.off}",
                f"    fix: {self.fix}"]


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _g(x) -> str:   # 1000000, not 1e+06
    return f"{float(x):.10g}"


def _label(reader: str) -> str:
    """A re-derived reader (an id) with the measured release it stands for: "vLLM 07b12f1
    (vLLM 0.29.0)", "llama.cpp (llama-cpp-python 0.3.36)"; the bare name when none does."""
    r, release = readers.get(reader), measured.releases().get(reader)
    return f"{r.name} ({r.measured_name(release)})" if release else r.name
