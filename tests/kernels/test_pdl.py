"""Programmatic dependent launch switches (engine/kernels/pdl.py) on a machine without a GPU: what turns it
on, what says why it is off, and that a kernel table keeps it only when a kernel runs."""
from __future__ import annotations

from engine import kernels
from engine.kernels import pdl


def test_launch_options_only_add_the_attribute_when_on():
    assert pdl.launch_options(False) == {"PDL": False}
    assert pdl.launch_options(True) == {"PDL": True, "launch_pdl": True}


def test_no_pdl_without_cuda():
    ok, why = pdl.support("cpu")
    assert not ok and why


def test_kernel_tables_keep_their_pdl_setting():
    ks = kernels.Kernels(kernels.NAMES, pdl=True)
    assert ks.pdl
    assert not kernels.Kernels((), pdl=True).pdl  # nothing runs as Triton: nothing to launch with PDL
    assert "pdl=True" in repr(ks)
