"""Cloning from reference FILES at any common rate equals the official qwen-tts 0.1.1 (tiny random Base
checkpoint, CPU fp32, greedy): the 24 kHz audio both engines resample to, the speaker embedding, the ICL
reference codes, and the greedy codes of x-vector and ICL clones.
"""
import pytest
import torch

from engine import Engine
from tests.support.reference_files import RATES, compare, write_reference


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["base"], device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def oracle(tiny_checkpoints, qwen_tts):
    return qwen_tts.Qwen3TTSModel.from_pretrained(str(tiny_checkpoints["base"]), device_map="cpu",
                                                  dtype=torch.float32)


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("rate", RATES)
def test_clone_from_reference_file_matches_official(engine, oracle, tmp_path, rate, channels, subtype):
    row = compare(engine, oracle, write_reference(tmp_path / "ref.wav", rate, channels, subtype))
    print(rate, channels, subtype, row)
    assert row["same_length"] and row["audio_max_diff"] == 0.0, row
    # The same audio goes in; the two speaker encoders' fp32 CPU math rounds alike only up to the machine's
    # kernels (1.4e-6 on an AMD EPYC, 0 before): 1e-5, as tests/engine/test_parity_generate.py. The old filter missed
    # by 8e-2 to 1.2e-1, so the bound still tells the resamplers apart.
    assert row["xvec_embedding_max_diff"] <= 1e-5 and row["icl_embedding_max_diff"] <= 1e-5, row
    assert row["ref_codes_equal"], row
    assert row["xvec_codes_equal"] and row["icl_codes_equal"], row
