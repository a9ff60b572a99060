"""Shapes checked: with LUDIC_CHECK_SHAPES=1 (the test suite) a wrong shape fails where it enters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from jaxtyping import TypeCheckError

from ludic.training import shapes
from ludic.training.layout.micro_batching import _check_collated
from ludic.training.loss import CISPOLoss, TokenKLLoss, compute_logp_action, compute_token_logps, seq_reduce


def test_the_suite_runs_with_shape_checking_on():
    assert os.environ["LUDIC_CHECK_SHAPES"] == "1" and shapes.CHECK_SHAPES


def test_logits_and_ids_of_different_lengths_fail_in_compute_token_logps_naming_T():
    with pytest.raises(TypeCheckError, match=r"compute_token_logps[\s\S]*\bT=5\b|T=5[\s\S]*compute_token_logps"):
        compute_token_logps(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))


def test_float_input_ids_are_refused_by_dtype():
    with pytest.raises(TypeCheckError, match="input_ids"):
        compute_token_logps(torch.zeros(2, 5, 7), torch.zeros(2, 5))


def test_an_action_mask_of_another_batch_size_fails_in_the_helper_that_got_it():
    with pytest.raises(TypeCheckError, match=r"compute_logp_action[\s\S]*B=2"):
        compute_logp_action(torch.zeros(2, 5, 7), torch.zeros(2, 5, dtype=torch.long), torch.ones(3, 5))
    with pytest.raises(TypeCheckError, match="seq_reduce"):
        seq_reduce(torch.zeros(2, 5), torch.ones(2, 6), length_normalize=False)


def test_a_loss_given_per_sequence_logps_instead_of_per_token_fails_at_its_entry():
    batch = {"action_mask": torch.ones(2, 5), "ref_logps": torch.zeros(2, 5)}
    with pytest.raises(TypeCheckError, match="compute_from_logps"):
        TokenKLLoss().compute_from_logps(torch.zeros(2), batch)
    with pytest.raises(TypeCheckError, match="policy_logps"):
        CISPOLoss().compute_from_logps(torch.zeros(2, 5, 1), batch)


def test_collated_batch_shapes_are_checked():
    ids = torch.zeros(2, 4, dtype=torch.long)
    _check_collated(ids, ids, ids, torch.ones(2))
    with pytest.raises(TypeCheckError, match="weight"):
        _check_collated(ids, ids, ids, torch.ones(3))


def test_checking_is_off_by_default_outside_the_suite():
    env = {k: v for k, v in os.environ.items() if k != "LUDIC_CHECK_SHAPES"}
    code = "from ludic.training.loss import base; print(hasattr(base.seq_reduce, '__wrapped__'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
