"""Label-private mode: no private label value makes the run fail or shows in a message (issue 29). A label outside
the public domain [0, C) is mapped to class 0 before the mechanism, the same rule as a record labelled 0."""
import torch

from fastdpot.flows import ClassConditionalFlow
from fastdpot.flows.labelled import embed_labelled_rows, label_rows


def _flow():
    return ClassConditionalFlow(30, 2, 4, 0.5, num_classes=3, noise_multiplier=1.0, batch_size=5, steps=3,
                                secure_mode=False, generator=torch.Generator().manual_seed(0))


def test_labels_outside_the_public_domain_run_as_class_zero():
    x = torch.randn(20, 2, generator=torch.Generator().manual_seed(1))
    odd = torch.arange(20) % 3
    odd[[3, 7, 11]] = torch.tensor([3, -1, 99])  # outside [0, 3): a data-dependent abort before issue 29
    mapped = odd.clone()
    mapped[[3, 7, 11]] = 0
    a, b = _flow(), _flow()
    xa, ya = a.run(x, odd, progress=False)
    xb, yb = b.run(x, mapped, progress=False)
    torch.testing.assert_close(xa, xb, rtol=0, atol=0)
    assert torch.equal(ya, yb) and a.epsilon() == b.epsilon() > 0
    rows = label_rows(x, odd, 3)
    assert torch.equal(rows[:, 2:].argmax(1), mapped)
    emb = embed_labelled_rows(rows, 2, 1.0, 1.0)
    assert torch.equal(emb[:, 2:].argmax(1), mapped)
