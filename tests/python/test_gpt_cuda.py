"""The fused GPT trained from Python on one GPU (skips without one): model.to("cuda"), token
batches on the GPU, td.optim.AdamW with clipping, compared step by step with the same run on
the CPU backend."""
import pytest

import tardelli as td

pytestmark = pytest.mark.skipif(not td.cuda.is_available(),
                                reason="no CUDA device (runs on the GPU machine)")


def _run(device, arch, steps=5):
    cfg = td.models.GPTConfig(arch=arch, vocab_size=257, block_size=64, n_layer=2, n_head=4,
                              n_kv_head=2 if arch == "llama" else 0, d_model=128, seed=3)
    model = td.models.GPT(cfg).to(device)
    opt = td.optim.AdamW(model.param_groups(weight_decay=0.1), lr=3e-3, eps=1e-3)
    gen = td.Generator(7)
    losses = []
    for _ in range(steps):
        x = td.randint(0, 257, (4, 64), generator=gen).to(device)
        y = td.randint(0, 257, (4, 64), generator=gen).to(device)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        td.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_training_on_cuda_tracks_cpu(arch):
    """Five AdamW steps on random tokens: the per-step losses on CUDA equal the CPU's within 1e-4
    relative. fp32 summation-order noise is ~1e-6 relative per op and grows a little through 5
    updates; a real divergence (a wrong gradient) shows at the ~1e-3 level the loss moves per
    step here. The loss falls on both."""
    gpu_model, gpu_losses = _run("cuda", arch)
    _, cpu_losses = _run("cpu", arch)
    assert all(p.device.type == "cuda" for p in gpu_model.parameters())
    for s, (g, c) in enumerate(zip(gpu_losses, cpu_losses)):
        assert abs(g - c) <= 1e-4 * abs(c), f"step {s}: cuda {g} vs cpu {c}"
    assert gpu_losses[-1] < gpu_losses[0]
