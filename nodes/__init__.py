"""ComfyUI layer of the pack. Pure helpers (text_split, audio_utils, sampling, paths) import no
ComfyUI; the node modules do, and are imported only by `extension.py` when ComfyUI loads the pack."""
