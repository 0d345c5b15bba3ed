"""Convert a ComfyUI workflow from UI (graph) format to API (prompt) format, using /object_info.

    python scripts/ui_to_api.py WORKFLOW.json OBJECT_INFO.json > prompt.json

Covers what the frontend's own "save (API)" does for ordinary graphs: widget values are matched to the
node's widget inputs in `input_order` (required, then optional), an INT/COMBO with
`control_after_generate` takes one extra value (fixed/increment/randomize), links override widget
values, muted (mode 2) and bypassed (mode 4) nodes are dropped. Groups/subgraphs/primitive nodes are
not supported (our example workflows use none of them).
"""
from __future__ import annotations

import json
import sys

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def is_widget(spec) -> bool:
    typ, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
    if opts.get("forceInput") or opts.get("rawLink"):
        return False
    return isinstance(typ, list) or typ in WIDGET_TYPES


def _has_control(spec) -> bool:
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return bool(opts.get("control_after_generate"))


def widget_names(info: dict) -> list[tuple[str, bool]]:
    """[(input name, has an extra control value)] in the order the frontend creates the widgets."""
    out = []
    inputs = info.get("input", {})
    order = info.get("input_order") or {k: list(v) for k, v in inputs.items()}
    for section in ("required", "optional"):
        for name in order.get(section, []):
            spec = inputs.get(section, {}).get(name)
            if spec is not None and is_widget(spec):
                out.append((name, _has_control(spec)))
    return out


def convert(workflow: dict, object_info: dict) -> dict:
    links = {}
    for link in workflow.get("links", []):
        if isinstance(link, dict):
            links[link["id"]] = (link["origin_id"], link["origin_slot"])
        else:
            links[link[0]] = (link[1], link[2])
    nodes = {n["id"]: n for n in workflow["nodes"]}
    dropped = {nid for nid, n in nodes.items() if n.get("mode", 0) in (2, 4)}
    prompt = {}
    for nid, node in nodes.items():
        if nid in dropped or node["type"] in ("Note", "MarkdownNote"):
            continue
        info = object_info.get(node["type"])
        if info is None:
            raise KeyError(f"node {nid}: type {node['type']!r} is not in /object_info (pack not loaded?)")
        inputs = {}
        values = node.get("widgets_values", [])
        if isinstance(values, dict):
            names = dict(widget_names(info))
            inputs.update({k: v for k, v in values.items() if k in names})
        else:
            i = 0
            for name, control in widget_names(info):
                if i >= len(values):
                    break
                inputs[name] = values[i]
                i += 2 if control else 1
        for inp in node.get("inputs", []):
            link = inp.get("link")
            if link is None:
                continue
            src, slot = links[link]
            if src in dropped:
                continue
            inputs[inp["name"]] = [str(src), slot]
        prompt[str(nid)] = {"class_type": node["type"], "inputs": inputs,
                            "_meta": {"title": node.get("title") or info.get("display_name") or node["type"]}}
    return prompt


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        wf = json.load(f)
    with open(sys.argv[2], encoding="utf-8") as f:
        oi = json.load(f)
    json.dump(convert(wf, oi), sys.stdout, indent=2)
