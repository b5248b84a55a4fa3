"""A tiny decoder-only LM trained a few steps by DeepSpeed on CPU (gloo), to produce a real DeepSpeed log."""
import os
import torch
import deepspeed

torch.manual_seed(0)
V, H, L, S, MB = 512, 128, 2, 64, 4


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, H)
        layer = torch.nn.TransformerEncoderLayer(H, 4, 4 * H, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, L)
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.blocks(self.emb(x), mask=mask, is_causal=True))


config = {"train_batch_size": MB * int(os.environ.get("WORLD_SIZE", 1)) * 2, "train_micro_batch_size_per_gpu": MB,
          "gradient_accumulation_steps": 2, "steps_per_print": 1, "zero_optimization": {"stage": 1},
          "gradient_clipping": 1.0, "wall_clock_breakdown": False}
deepspeed.utils.logging.set_log_level_from_string("info")  # what HF Trainer and most launch scripts show
deepspeed.init_distributed(dist_backend="gloo")
model = Tiny()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
for _micro_step in range(12 * 2):   # 12 optimizer steps of 2 micro-batches
    x = torch.randint(0, V, (MB, S + 1))
    logits = engine(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
    engine.backward(loss)
    engine.step()
