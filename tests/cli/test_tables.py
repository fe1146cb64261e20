"""What the CLI prints: a cost that does not apply is left out, not printed as NaN."""

import dataclasses
import math

from mismatch.cli.tables import recipe_text


def test_a_recipe_of_a_format_without_stored_bits_prints_no_nan():
    recipe = {"spec": "noise:1", "kept": ["model.layers.0.mlp.down_proj"], "kept_fraction": 0.1,
              "bits_per_weight": math.nan, "verified_status": "admit", "verified_value": 0.1,
              "vllm_ignored_layers": [], "llmcompressor_ignore": ["lm_head"], "layers": "linear"}
    text = recipe_text(recipe)
    assert "nan" not in text.lower() and "bits/weight" not in text and "10.0% of the linear weights)" in text
    assert "4.00 bits/weight" in recipe_text({**recipe, "spec": "int4:group128", "bits_per_weight": 4.0})


def test_progress_off_a_terminal_is_plain_lines():
    """A log or CI gets lines (start, end, and at most one per `every` seconds), not invisible bars."""
    import io

    from rich.console import Console

    from mismatch.cli.tables import Bars

    buffer = io.StringIO()
    with Bars(Console(file=buffer, force_terminal=False), every=3600) as bars:
        for done in range(4):
            bars.update("opd fp8", done, 3, f"loss {done}")
    lines = buffer.getvalue().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["opd fp8: 0/3 loss 0", "opd fp8: 3/3 loss 3"]
    buffer = io.StringIO()
    with Bars(Console(file=buffer, force_terminal=False), every=0) as bars:
        for done in range(4):
            bars.update("sweep", done, 3)
    assert len(buffer.getvalue().splitlines()) == 4


def test_the_thresholds_table_names_each_losss_first_step_and_window_limits():
    """`mismatch thresholds` prints the per-loss limits under its table, first-step and window, each with the
    interval the data pin it to; the shipped thresholds hold both for the two losses the study decided."""
    import io

    from rich.console import Console

    from mismatch.admission.thresholds import load_thresholds
    from mismatch.cli.tables import thresholds_table

    t = load_thresholds()
    buffer = io.StringIO()
    Console(file=buffer, width=400).print(thresholds_table(t))
    text = buffer.getvalue()
    for where, per_loss in (("", t.loss_limits), (", window", t.loss_window_limits)):
        assert per_loss and f"{t.primary}{where} per loss" in text
        for loss, v in per_loss.items():
            assert f"{loss} ≤ {v['limit']:.3g} [{v['bracket'][0]:.3g}, {v['bracket'][1]:.3g}]" in text
    # and each loss's length law: its exponents' lower end as fitted, an open upper end as +∞
    assert t.loss_length_laws and "length law (limit ∝ T^b beyond the fitted lengths) per loss" in text
    for loss, v in t.loss_length_laws.items():
        high = f"{v['b_high']:+.2f}" if math.isfinite(v["b_high"]) else "+∞"
        assert f"{loss} b in [{v['b_low']:+.2f}, {high}]" in text
    # a file from before the per-loss laws: the envelope for every loss; a loss whose ladder bounds nothing named
    old = dataclasses.replace(t, loss_length_laws={}, loss_open_ladders={})
    buffer = io.StringIO()
    Console(file=buffer, width=400).print(thresholds_table(old))
    text = " ".join(buffer.getvalue().split())  # the caption as one line, wherever it wrapped
    assert "per loss: every loss the envelope of every ladder, b in" in text and "any other loss" not in text
    some = dataclasses.replace(t, loss_open_ladders={"pg-rkl": "ladder bounds no exponent"})
    buffer = io.StringIO()
    Console(file=buffer, width=400).print(thresholds_table(some))
    assert "pg-rkl (its ladder bounds no exponent) and any other loss every ladder's envelope" in " ".join(buffer.getvalue().split())
