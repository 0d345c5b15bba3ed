"""The typed keys under which the application holds its backend, model and settings."""
from __future__ import annotations

from aiohttp import web

BACKEND = web.AppKey("backend", object)
MODEL = web.AppKey("model", object)
SETTINGS = web.AppKey("settings", object)
