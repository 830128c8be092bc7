"""KV-cache katas: the grader, the kata manifest and the shared building blocks."""

__version__ = "0.1.0"
