"""`model.activation_checkpointing`: the same gradients, fewer saved activations, the same checkpoint keys."""

import torch

from tinylm.train.module import TinyLM


def _pair(**kw) -> tuple[TinyLM, TinyLM]:
    hp = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, pad_vocab_multiple=1, **kw)
    torch.manual_seed(0)
    plain = TinyLM(**hp)
    ckpt = TinyLM(**hp, activation_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def _saved_bytes(module: TinyLM, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one forward (parameters excluded)."""
    params = {p.data_ptr() for p in module.parameters()}
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module._loss((x, y)).backward()
    return total


def test_checkpointing_keeps_gradients_and_saves_activations():
    """Recomputing blocks must give the same gradients (a wrong recompute, e.g. a lost mask or dropout RNG, trains a
    different model) and must really keep less for backward (a wrapper that never engages saves nothing)."""
    plain, ckpt = _pair(dropout=0.1)
    x = torch.randint(0, 50, (4, 16))
    y = torch.randint(0, 50, (4, 16))
    torch.manual_seed(1)
    full = _saved_bytes(plain, x, y)
    torch.manual_seed(1)
    kept = _saved_bytes(ckpt, x, y)
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    assert kept < 0.6 * full, (kept, full)


def test_checkpointing_changes_no_keys_and_not_eval():
    """The option must not rename weights (checkpoints of both kinds load into each other) and must not run
    under no_grad/eval (generation would pay for recomputation that has no backward pass)."""
    plain, ckpt = _pair()
    assert list(plain.state_dict()) == list(ckpt.state_dict())
    ckpt.eval()
    x = torch.randint(0, 50, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), ckpt(x))


def test_checkpointed_copies_and_pickles_compute_with_their_own_weights():
    """Catches blocks patched through a closure over the original block: a deepcopy (EMA, SWA) ran with the
    original's weights, and pickling (ddp_spawn) failed."""
    import copy
    import pickle

    _, ckpt = _pair()
    x = torch.randint(0, 50, (2, 16))
    y = torch.randint(0, 50, (2, 16))
    twin, unpickled = copy.deepcopy(ckpt), pickle.loads(pickle.dumps(ckpt))
    with torch.no_grad():
        for p in ckpt.model.transformer.h.parameters():
            p.add_(0.5)  # only the original changes
    for other in (twin, unpickled):
        other.zero_grad()
        other._loss((x, y)).backward()
        assert all(p.grad is not None for p in other.model.transformer.h.parameters())  # its own blocks' graph
        torch.testing.assert_close(other.eval()(x), _pair()[0].eval()(x))  # its own (unchanged) weights
