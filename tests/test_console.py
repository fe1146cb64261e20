"""What the CLI prints: a cost that does not apply is left out, not printed as NaN."""

import math

from mismatch.console import recipe_text


def test_a_recipe_of_a_format_without_stored_bits_prints_no_nan():
    recipe = {"spec": "noise:1", "kept": ["model.layers.0.mlp.down_proj"], "kept_fraction": 0.1,
              "bits_per_weight": math.nan, "verified_status": "admit", "verified_value": 0.1,
              "vllm_ignored_layers": [], "llmcompressor_ignore": ["lm_head"], "layers": "linear"}
    text = recipe_text(recipe)
    assert "nan" not in text.lower() and "bits/weight" not in text and "10.0% of the linear weights)" in text
    assert "4.00 bits/weight" in recipe_text({**recipe, "spec": "int4:group128", "bits_per_weight": 4.0})
