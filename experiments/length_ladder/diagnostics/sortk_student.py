"""Diagnostic for the sortk build: can a small student learn the block-sort mixture, per rung?"""
import sys, time, torch
from mismatch.pairs.build import ModelShape, init_model, _examples, supervised_steps
from mismatch.pairs.tasks import BlockSortTask
from mismatch.pairs.evaluate import sampled_accuracy, greedy_accuracy
from mismatch.model.loader import LM
from mismatch.model.tokenizer import byte_tokenizer
torch.set_num_threads(1)
width, layers, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
task = BlockSortTask()
tok = byte_tokenizer()
ex = _examples(task, task.prompts("train", 40000, seed=0))
rungs = {k: BlockSortTask(name="sortk", min_blocks=k, max_blocks=k) for k in (1, 4, 20)}
evals = {k: t.prompts("held_out", 48, seed=0) for k, t in rungs.items()}
shape = ModelShape(family="gpt2", width=width, layers=layers, heads=4, kv_heads=4, ffn=4 * width, context=384)
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
supervised_steps(m, ex, steps=steps, lr=1e-3, batch_size=64, seed=1, on_step=on_step)
