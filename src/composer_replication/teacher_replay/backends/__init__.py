"""Teacher backends: one file per backend behind :class:`Backend`, chosen by the spec's ``backend``."""

from __future__ import annotations

from .base import Backend, ChatRequest, ChatResponse, TeacherError
from .factory import make_backend

__all__ = ["Backend", "ChatRequest", "ChatResponse", "TeacherError", "make_backend"]
