"""The browser tests' console filter: CDP console events become entries, and entries from the pack are told
apart from the frontend's own (so the matrix fails on the pack's errors only)."""
from tests.support.cdp import console_entry, from_pack

FOLDER, MARKERS = "qwen3-tts-fast", ("qwen3tts", "qwen3-tts")
PACK_JS = "http://127.0.0.1:8188/extensions/qwen3-tts-fast/takes.js"


def test_exception_in_a_pack_file_is_the_packs():
    e = console_entry("Runtime.exceptionThrown", {"exceptionDetails": {
        "text": "Uncaught", "exception": {"description": "TypeError: x is undefined"}, "url": "",
        "stackTrace": {"callFrames": [{"url": PACK_JS}, {"url": "http://127.0.0.1:8188/assets/app.js"}]}}})
    assert e["level"] == "error" and e["text"] == "TypeError: x is undefined"
    assert from_pack(e, FOLDER, MARKERS)


def test_error_logged_by_the_frontend_about_a_pack_node_is_the_packs():
    e = console_entry("Runtime.consoleAPICalled", {"type": "error", "args": [
        {"type": "string", "value": "Error in onExecuted of Qwen3TTSFast_PickTake"}],
        "stackTrace": {"callFrames": [{"url": "http://127.0.0.1:8188/assets/app.js"}]}})
    assert e["level"] == "error" and from_pack(e, FOLDER, MARKERS)


def test_frontend_and_network_errors_of_others_are_not_the_packs():
    jobs = console_entry("Log.entryAdded", {"entry": {
        "source": "network", "level": "error", "text": "Failed to load resource: 404",
        "url": "http://127.0.0.1:8188/api/jobs?status=in_progress"}})
    typeerr = console_entry("Runtime.consoleAPICalled", {"type": "error", "args": [
        {"type": "object", "description": "TypeError: Cannot read properties of undefined (reading 'id')\n"
                                         "    at onChange (http://127.0.0.1:8188/assets/index.js:58:1)"}]})
    assert jobs["source"] == "log/network" and jobs["level"] == "error"
    assert not from_pack(jobs, FOLDER, MARKERS) and not from_pack(typeerr, FOLDER, MARKERS)


def test_other_events_are_ignored():
    assert console_entry("Page.loadEventFired", {"timestamp": 1.0}) is None
