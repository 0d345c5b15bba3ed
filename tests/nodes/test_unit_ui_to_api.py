"""UI -> API workflow conversion (scripts/ui_to_api.py)."""
from tests.support._q3support import load_script

ui_to_api = load_script("ui_to_api")

OBJECT_INFO = {
    "Gen": {"input": {"required": {"model": ["M", {}], "text": ["STRING", {}],
                                   "seed": ["INT", {"control_after_generate": True}], "takes": ["INT", {}]},
                      "optional": {"mode": ["COMBO", {"options": ["a", "b"]}], "voice": ["V", {}]}},
            "input_order": {"required": ["model", "text", "seed", "takes"], "optional": ["mode", "voice"]}},
    "Load": {"input": {"required": {"ckpt": [["x", "y"], {}]}}, "input_order": {"required": ["ckpt"]}},
}


def test_widgets_links_and_control_values():
    wf = {"nodes": [
        {"id": 1, "type": "Load", "widgets_values": ["y"], "inputs": []},
        {"id": 2, "type": "Gen", "widgets_values": ["hi", 7, "randomize", 3, "b"],
         "inputs": [{"name": "model", "type": "M", "link": 5}, {"name": "voice", "type": "V", "link": None}]},
        {"id": 3, "type": "Gen", "mode": 2, "widgets_values": []},
        {"id": 4, "type": "Note", "widgets_values": ["text"]},
    ], "links": [[5, 1, 0, 2, 0, "M"]]}
    api = ui_to_api.convert(wf, OBJECT_INFO)
    assert set(api) == {"1", "2"}
    assert api["1"]["inputs"] == {"ckpt": "y"}
    assert api["2"]["inputs"] == {"text": "hi", "seed": 7, "takes": 3, "mode": "b", "model": ["1", 0]}


def test_linked_widget_overrides_value():
    wf = {"nodes": [
        {"id": 1, "type": "Load", "widgets_values": ["x"]},
        {"id": 2, "type": "Gen", "widgets_values": ["hi", 1, "fixed", 1, "a"],
         "inputs": [{"name": "text", "type": "STRING", "widget": {"name": "text"}, "link": 9}]},
    ], "links": [{"id": 9, "origin_id": 1, "origin_slot": 0, "target_id": 2, "target_slot": 0, "type": "STRING"}]}
    assert ui_to_api.convert(wf, OBJECT_INFO)["2"]["inputs"]["text"] == ["1", 0]
