"""`python -m engine serve`: the engine behind an OpenAI-compatible HTTP API (docs/SERVER.md).

aiohttp is imported only by the modules that run the server (app.py, speech.py, main.py), and only when `serve`
runs; the rest of this package, like the engine, needs nothing beyond the engine's own dependencies.
"""
