"""The Python examples of the README and of the docs pages run, as written but for a few stand-ins that keep
them fast: a tiny model for SmolLM2 (no chat template, 3 blocks), a few OPD steps, a noisier rollout for the
check (so that it rejects and searches a recipe). Each stand-in must apply, so an example that drifts from them
fails here too."""

import re
from pathlib import Path

import pytest

import mismatch
from mismatch.dumps import DumpRecord, write_rollouts

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [(f"{page.relative_to(ROOT)} python block {i}", block) for page in PAGES
          for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S))]
STAND_INS = [  # (pattern, replacement, blocks it must apply to)
    ('"smollm2-135m"', '"tiny-llama"', None),
    ('opd.OPDConfig(pair="sort-gpt2"', 'opd.OPDConfig(pair="sort-gpt2", steps=2, batch_size=4, eval_every=2, '
                                      'eval_prompts=8', "opd.OPDConfig("),
    ('rollout="int4:group128", presets=', 'rollout="noise:1", presets=', "mismatch.check("),
    ('max_new_tokens=64, chat=True)', 'max_new_tokens=64, chat=False)', "mismatch.generate(ref"),  # no chat template
    ('layers="0-3,7"', 'layers="0-1"', "w8a8"),  # tiny-llama has 3 blocks
    ('per_device_train_batch_size=64, max_steps=80,', 'per_device_train_batch_size=8, max_steps=2,',
     "MismatchDistillationTrainer("),
]


def _runnable(block: str) -> str:
    for pattern, replacement, marker in STAND_INS:
        if marker is None or marker in block:
            if marker is not None:
                assert pattern in block, f"example drifted from its stand-in {pattern!r}"
            block = block.replace(pattern, replacement)
    return block


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory holding the dump the score-rollouts example reads."""
    monkeypatch.chdir(tmp_path)
    lm = mismatch.load("tiny-llama")
    ids = lm.tokenizer("hello there, general")["input_ids"]
    write_rollouts(tmp_path / "rollouts.jsonl", [DumpRecord(tuple(ids[:3]), tuple(ids[3:]), (-1.0,) * (len(ids) - 3))])
    return tmp_path


def test_the_readme_and_the_docs_have_python_examples():
    readme = [name for name, _ in BLOCKS if name.startswith("README.md")]
    assert len(readme) >= 4 and len(BLOCKS) > len(readme) and all(b.strip() for _, b in BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("name,block", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_every_python_example_runs(workdir, name, block):
    namespace: dict = {}
    exec(compile(_runnable(block), name, "exec"), namespace)  # noqa: S102 - the docs' own code
