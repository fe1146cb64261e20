"""Diagnostic: sortk with every prompt digit tagged by its block letter (a8a3a7b9b1 → a378b19)."""
import re, sys, time, torch
from dataclasses import dataclass
from mismatch.pairs.build import ModelShape, init_model, _examples, supervised_steps
from mismatch.pairs.tasks import BlockSortTask, BLOCK_TAGS
from mismatch.pairs.evaluate import sampled_accuracy, greedy_accuracy
from mismatch.model.loader import LM
from mismatch.model.tokenizer import byte_tokenizer

@dataclass(frozen=True, kw_only=True)
class Tagged(BlockSortTask):
    def _draw(self, rng):
        k = rng.randint(self.min_blocks, self.max_blocks)
        return "sortk:" + "".join("".join(tag + rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits))) for tag in BLOCK_TAGS[:k]) + "="
    def answer(self, prompt):
        body = prompt[len("sortk:"):-1]
        out = {}
        for tag, d in re.findall(r"([a-t])(\d)", body):
            out.setdefault(tag, []).append(d)
        return "".join(t + "".join(sorted(ds)) for t, ds in out.items())

torch.set_num_threads(1)
width, layers, steps, lr = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
task = Tagged()
tok = byte_tokenizer()
ex = _examples(task, task.prompts("train", 40000, seed=0))
print("max len", max(len(i) for i, _ in ex), flush=True)
rungs = {k: Tagged(min_blocks=k, max_blocks=k) for k in (1, 4, 20)}
evals = {k: t.prompts("held_out", 48, seed=0) for k, t in rungs.items()}
shape = ModelShape(family="gpt2", width=width, layers=layers, heads=4, kv_heads=4, ffn=4 * width, context=512)
m = init_model(shape, 1)
print("params", sum(p.numel() for p in m.parameters()), flush=True)
t0 = time.time()
def on_step(s, loss):
    if s % (steps // 4) == 0:
        lm = LM(m, tok, "student")
        res = {k: (round(greedy_accuracy(lm, rungs[k], evals[k]), 3), round(sampled_accuracy(lm, rungs[k], evals[k], seed=7), 3)) for k in rungs}
        m.train()
        print(f"step {s} loss {loss:.3f} greedy/sampled per rung {res} {time.time()-t0:.0f}s", flush=True)
    return False
supervised_steps(m, ex, steps=steps, lr=lr, batch_size=64, seed=1, on_step=on_step)
