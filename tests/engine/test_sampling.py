"""Sampling math against plain, row-by-row reference implementations of the HF semantics."""
import math

import pytest
import torch

from engine import sampling
from engine.errors import InvalidInputError
from engine.sampling import SamplingParams


def ref_penalty(row, generated, p):
    out = list(row)
    for i in set(generated):
        out[i] = out[i] / p if out[i] > 0 else out[i] * p
    return out


def ref_top_k_top_p(row, k, p):
    row = list(row)
    if 0 < k < len(row):
        kth = sorted(row, reverse=True)[k - 1]
        row = [x if x >= kth else -math.inf for x in row]
    if p < 1.0:
        m = max(row)
        ex = [math.exp(x - m) if x != -math.inf else 0.0 for x in row]
        z = sum(ex)
        order = sorted(range(len(row)), key=lambda i: -row[i])
        mass = 0.0
        keep = set()
        for i in order:
            if mass < p or not keep:
                keep.add(i)
            mass += ex[i] / z
        row = [x if i in keep else -math.inf for i, x in enumerate(row)]
    return row


def test_repetition_penalty_matches_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g)
    generated = [[1, 5, 5, 9], [], [0, 39]]
    seen = torch.zeros(3, 40, dtype=torch.bool)
    for r, ids in enumerate(generated):
        seen[r, ids] = True
    got = sampling.penalize_repeats(logits, seen, 1.3)
    for r in range(3):
        assert got[r].tolist() == pytest.approx(ref_penalty(logits[r].tolist(), generated[r], 1.3))


@pytest.mark.parametrize("k,p", [(0, 1.0), (5, 1.0), (0, 0.7), (10, 0.5), (1, 0.9), (40, 0.99)])
def test_top_k_top_p_matches_reference(k, p):
    g = torch.Generator().manual_seed(k * 100 + int(p * 10))
    logits = torch.randn(4, 40, generator=g) * 2
    got = sampling.filter_top_k_top_p(logits, k, p)
    for r in range(4):
        want = ref_top_k_top_p(logits[r].tolist(), k, p)
        assert [math.isinf(x) for x in got[r].tolist()] == [math.isinf(x) for x in want]


def test_control_mask_bans_control_ids_but_eos():
    mask = sampling.control_mask(3072, 2150, "cpu")
    assert not mask[:2048].any()
    assert mask[2048:].sum() == 1023 and not mask[2150]


def test_uniforms_are_deterministic_per_take_and_in_range():
    keys = sampling.take_keys(1234, range(4), "cpu")
    u1 = sampling.uniforms(keys, 7, 3, 2048)
    u2 = sampling.uniforms(sampling.take_keys(1234, [2], "cpu"), 7, 3, 2048)
    assert torch.equal(u1[2], u2[0])  # take 2 of a batch == take 2 alone
    assert (u1 > 0).all() and (u1 < 1).all()
    assert not torch.equal(u1[0], u1[1])
    assert not torch.equal(u1, sampling.uniforms(keys, 8, 3, 2048))
    assert not torch.equal(u1, sampling.uniforms(sampling.take_keys(1235, range(4), "cpu"), 7, 3, 2048))
    # 64-bit seeds (ComfyUI's range) are accepted and differ in their high half
    big = sampling.take_keys(0xFFFFFFFF00000000, [0], "cpu")
    assert not torch.equal(big, sampling.take_keys(0, [0], "cpu"))


def test_uniforms_never_reach_0_or_1():
    u = sampling.unit_interval(torch.tensor([0, 1 << 9, (1 << 32) - 512, (1 << 32) - 1], dtype=torch.int64))
    assert (u > 0).all() and (u < 1).all() and (-torch.log(u) > 0).all()


def test_uniforms_look_uniform():
    keys = sampling.take_keys(7, range(8), "cpu")
    u = torch.cat([sampling.uniforms(keys, s, 0, 3072) for s in range(8)]).flatten()
    assert abs(u.mean().item() - 0.5) < 0.005
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.005


def test_exponential_race_draws_the_right_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    logits = probs.clamp_min(1e-30).log()
    logits[-1] = float("-inf")
    n = 20000
    keys = sampling.take_keys(99, range(n), "cpu")
    u = sampling.uniforms(keys, 0, 0, 5)
    picks = sampling.choose(logits.expand(n, -1).clone(), True, 1.0, 0, 1.0, u)
    counts = torch.bincount(picks, minlength=5).float()
    expected = probs * n
    chi2 = (((counts[:4] - expected[:4]) ** 2) / expected[:4]).sum().item()
    assert counts[4] == 0
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    assert sampling.choose(logits, False, 0.9, 50, 1.0, None).tolist() == [1, 0]


def test_params_validation():
    SamplingParams().validate()
    for bad in (dict(max_new_tokens=0), dict(max_new_tokens=-3), dict(temperature=0), dict(top_p=0),
                dict(top_p=1.5), dict(top_k=-1), dict(subtalker_temperature=-1), dict(repetition_penalty=0),
                dict(min_new_tokens=5, max_new_tokens=3)):
        with pytest.raises(InvalidInputError):
            SamplingParams(**bad).validate()


def test_frame_uniforms_equal_per_slot_uniforms():
    keys = sampling.take_keys(5, range(3), "cpu")
    frame = sampling.frame_uniforms(keys, torch.tensor([7]), 16, 3072)
    for slot, width in ((0, 3072), (1, 2048), (15, 2048)):
        assert torch.equal(frame[:, slot, :width], sampling.uniforms(keys, 7, slot, width))
