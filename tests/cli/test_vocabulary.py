"""One vocabulary at the surfaces: every command's options, listed from the app itself, name one idea one way.
The table of synonyms grows as the surfaces converge (issue: the house, third step)."""

import typer

from mismatch.cli.app import app

# an idea → the one option name every command uses for it, and the names it must not take
ONE_NAME = {"where a command writes": ("--out", {"--out-dir", "--output", "--output-dir", "--out-path", "--dest"}),
            "an engine's rollout dump read": ("--dump", {"--rollouts", "--rollout-file", "--rollouts-file"})}


def _commands(group=None, prefix=""):
    group = group if group is not None else typer.main.get_command(app)
    for name, sub in getattr(group, "commands", {}).items():
        path = f"{prefix} {name}".strip()
        yield from _commands(sub, path) if hasattr(sub, "commands") else [(path, sub)]
        if hasattr(sub, "commands") and sub.params:  # a group with its own options (`pairs`)
            yield path, sub


def options() -> dict[str, set[str]]:
    """`command path → its long option names`, every command of `mismatch`."""
    return {path: {o for p in cmd.params for o in getattr(p, "opts", ()) if o.startswith("--")}
            for path, cmd in _commands()}


def test_the_listing_reaches_every_command():
    listed = options()
    assert {"probe", "opd", "sweep", "report", "check", "monitor", "score-rollouts", "pairs build"} <= set(listed)
    assert "--out" in listed["report"] and "--out" in listed["sweep"]


def test_each_idea_has_one_option_name_across_commands():
    for idea, (name, others) in ONE_NAME.items():
        clashes = {path: sorted(opts & others) for path, opts in options().items() if opts & others}
        assert not clashes, f"{idea} is {name} everywhere; these commands call it otherwise: {clashes}"
