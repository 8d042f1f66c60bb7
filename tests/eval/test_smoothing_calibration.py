"""Key smoothing in the decode-faithful evaluation: `calibrate` fits the factors first."""
import pytest
import torch

import kvlab
from kvlab.quant import fit_smoothing


def test_faithful_calibration_fits_factors_first(smollm2):
    """`calibrate` gives a smoothed key spec its factors (past the scheme's sinks) and fits the calibrated codebook
    to the smoothed keys; the evaluation refuses a smoothed scheme without them."""
    from kvlab.eval.faithful import DecodeFaithfulBackend, calibrate
    model, tok = smollm2
    from kvlab.eval.perplexity import text_tokens
    ids = text_tokens(tok, "license")[:64][None]
    sch = kvlab.scheme("k=lm3:g64:cal:smooth,v=lm3,sink=4,L1=q4_0")
    cal = calibrate(model, ids, sch)
    n = model.config.n_layers
    assert set(cal[0]["k"]) == {"smooth", "codebook"} and "k" not in cal[1] and "v" not in cal[0]
    cap = model.capture(ids)
    assert torch.equal(cal[0]["k"]["smooth"][:, 0], fit_smoothing(cap["k"][0], cap["q"][0], sink=4))
    with pytest.raises(ValueError, match="calib=calibrate"):
        DecodeFaithfulBackend(sch, n)
    DecodeFaithfulBackend(sch, n, cal)


def test_faithful_calibration_ties_pairs_for_smooth_pair(smollm2):
    """`smooth=pair`: `calibrate` fits factors tied within RoPE pairs (the pair-energy fit of `fit_smoothing`)."""
    from kvlab.eval.faithful import calibrate
    from kvlab.eval.perplexity import text_tokens
    model, tok = smollm2
    ids = text_tokens(tok, "license")[:64][None]
    cal = calibrate(model, ids, kvlab.scheme("k=lm2:s=e4m3:rot=had:smooth=pair,v=lm2,sink=4"))
    s = cal[0]["k"]["smooth"][:, 0]
    D = s.shape[-1]
    assert torch.equal(s[:, :D // 2], s[:, D // 2:])
    cap = model.capture(ids)
    assert torch.equal(s, fit_smoothing(cap["k"][0], cap["q"][0], sink=4, pairs=True))


def test_faithful_calibration_fits_permutations_over_spread_positions(smollm2):
    """`perm`: `calibrate` fits each layer's key channel order from the calibration text captured at positions
    spread over the model's context (smoothed first where the spec smooths); the order is a permutation per KV
    head, is what `fit_permutation` gives on those captures, and the evaluation refuses the scheme without it."""
    from kvlab.eval.faithful import DecodeFaithfulBackend, _spread_capture, calibrate
    from kvlab.eval.perplexity import text_tokens
    from kvlab.quant.permutation import check_permutation, fit_permutation
    model, tok = smollm2
    ids = text_tokens(tok, "license")[:48][None]
    sch = kvlab.scheme("k=int3:g32:asym:perm,v=int3:g32:asym,sink=2,L1=q4_0")
    cal = calibrate(model, ids, sch)
    n, Hk, D = model.config.n_layers, model.config.n_kv_heads, model.config.head_dim
    assert set(cal[0]["k"]) == {"perm"} and "k" not in cal[1] and "v" not in cal[0]
    assert cal[0]["k"]["perm"].shape == (Hk, 1, D)
    check_permutation(cal[0]["k"]["perm"][:, 0], Hk, D)
    sp = _spread_capture(model, ids)
    assert sp["k"][0].shape == (4, Hk, 48, D)  # four starts spread over the 8K context
    assert torch.equal(cal[0]["k"]["perm"][:, 0], fit_permutation(sp["k"][0], sp["q"][0], sch.k, sink=2))
    with pytest.raises(ValueError, match="calib=calibrate"):
        DecodeFaithfulBackend(sch, n)
    DecodeFaithfulBackend(sch, n, cal)
