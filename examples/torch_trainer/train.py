"""A tiny real ``torch.compile`` trainer for the lab (issue 15 item 4).

A two-layer causal transformer learns random tokens on the CPU, compiled by inductor's C++ backend
(forward and backward); the simulated GPUs (lab/fakegpu) hold memory for it as real GPUs would hold
its weights, so the collection's proof sees what it sees on a real host: GPU memory per trainer GPU,
then ``step=N loss=X tok/s=Y`` lines. Importing this file only imports torch: the pre-flight
(``python3 -c "import train"``) runs no step and touches no GPU.

Environment (all optional): ``TORCH_TRAINER_GPUS`` (``0,1``), ``TORCH_TRAINER_MIB`` per GPU (2048),
``TORCH_TRAINER_THREADS`` for torch's own work (1), ``TORCH_TRAINER_STEP_SLEEP_S`` between steps (0.2:
the lab's two cores are shared), ``TORCH_TRAINER_LOG_EVERY_S`` (1), ``TORCH_TRAINER_WARM_POOL`` (1: start inductor's compile
worker processes, see ``warm_compile_workers``); torch reads
``TORCHINDUCTOR_CACHE_DIR`` and ``TORCHINDUCTOR_COMPILE_THREADS`` itself.
"""
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 256, 64, 4, 2, 64, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t = x.shape[:2]
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList([Block() for _layer in range(LAYERS)])
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpus_from(text):
    return [int(p) for p in text.split(",") if p.strip()]


def cache_dir():
    """Where inductor writes its cache (torch's own rule: TORCHINDUCTOR_CACHE_DIR, else
    <tmp>/torchinductor_<user>)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir  # pylint: disable=import-outside-toplevel
    return inductor_cache_dir()


def say(text):
    print(text, flush=True)


def hold_gpu_memory(gpus, mib):
    """What moving the model to the GPUs does on a real host: memory held per GPU by this process."""
    import fakegpu  # pylint: disable=import-outside-toplevel  # the lab's simulated GPU library
    for gpu in gpus:
        fakegpu.allocate(gpu, mib)
    say("cuda: allocated %s" % ", ".join("gpu%d=%dMiB" % (g, mib) for g in gpus))


def warm_compile_workers():
    """Start inductor's compile worker processes (a sidecar and its pool), as torch.compile does by
    itself where triton is installed (the CUDA build). The CPU build compiles its C++ kernels in
    threads of this process and would start none: without this, a test could not see whether a
    restart ends them."""
    from torch._inductor.async_compile import AsyncCompile  # pylint: disable=import-outside-toplevel
    AsyncCompile.warm_pool()
    AsyncCompile.wakeup()


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    gpus = gpus_from(os.environ.get("TORCH_TRAINER_GPUS", "0,1"))
    mib = int(os.environ.get("TORCH_TRAINER_MIB", "2048"))
    pause = float(os.environ.get("TORCH_TRAINER_STEP_SLEEP_S", "0.2"))
    log_every = float(os.environ.get("TORCH_TRAINER_LOG_EVERY_S", "1"))
    torch.set_num_threads(int(os.environ.get("TORCH_TRAINER_THREADS", "1")))
    torch.manual_seed(0)
    say("torch trainer starting: release=%s pid=%d torch=%s gpus=%s inductor cache=%s"
        % (os.environ.get("DFLASH_RELEASE", "-"), os.getpid(), torch.__version__,
           ",".join(map(str, gpus)), cache_dir()))
    hold_gpu_memory(gpus, mib)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    compiled = torch.compile(model)  # inductor; on the CPU its C++ backend
    if os.environ.get("TORCH_TRAINER_WARM_POOL", "1") == "1":
        warm_compile_workers()

    def train_step():
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
        logits = compiled(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    say("compiling the model with torch.compile (inductor, cpp backend) ...")
    t0 = time.monotonic()
    loss = train_step()
    say("compiled: first step (forward + backward) in %.1f s, loss=%.4f" % (time.monotonic() - t0, loss))
    step, tokens, since = 1, 0, time.monotonic()
    while True:
        loss = train_step()
        step += 1
        tokens += BATCH * SEQ
        now = time.monotonic()
        if now - since >= log_every:
            say("step=%d loss=%.4f tok/s=%.1f" % (step, loss, tokens / (now - since)))
            tokens, since = 0, now
        time.sleep(pause)


if __name__ == "__main__":
    main()
