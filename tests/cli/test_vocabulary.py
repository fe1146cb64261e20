"""One vocabulary at the surfaces: every command's options, listed from the app itself, name one idea one way.
The table of synonyms grows as the surfaces converge (issue: the house, third step)."""

import typer

from mismatch.cli.app import app

# an idea → the one option name every command uses for it, and the names it must not take
ONE_NAME = {"where a command writes": ("--out", {"--out-dir", "--output", "--output-dir", "--out-path", "--dest"}),
            "an engine's rollout dump read": ("--dump", {"--rollouts", "--rollout-file", "--rollouts-file"}),
            "how many prompts of a set a command reads": ("--max-prompts", {"--n-prompts", "--num-prompts", "--prompts-n"}),
            "print the result as JSON": ("--json", {"--as-json", "--format-json", "--output-json"})}


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


# an option name that means something of its own in each command that takes it (said why), so its help differs
PER_COMMAND = {"--out": "a dataset, a folder, a file: what each command writes",
               "--max-new-tokens": "a probe's response length vs the check's calibration responses",
               "--max-prompts": "of a prompts file vs of the calibration set", "--prompts": "the same",
               "--ref-dtype": "a probe's reference dtype (fp16 too) vs the trainer's precision",
               "--seed": "what each command seeds", "--staleness": "run under vs measured for the check",
               "--temperature": "a probe's response (0: greedy) vs OPD's rollouts",
               "--threads": "the sweep's per task", "--rollout": "opd takes several; check one"}
RESULT_COMMANDS = ("probe", "opd", "check", "thresholds", "score-rollouts", "monitor")  # they print a result


def _helps() -> dict[str, set[str]]:
    helps: dict[str, set[str]] = {}
    for _path, cmd in _commands():
        for p in cmd.params:
            for o in getattr(p, "opts", ()):
                if o.startswith("--"):
                    helps.setdefault(o, set()).add(p.help)
    return helps


def test_an_option_shared_by_commands_has_one_help_text():
    """Help is written once (`mismatch.cli.common`'s shared options): a name several commands take says the same
    thing everywhere, unless its meaning is the command's own (`PER_COMMAND`, with why)."""
    helps = _helps()
    assert {"--layers", "--loss", "--lr", "--json", "--thresholds"} <= set(helps)  # the premise: shared options
    differing = {o: sorted(h) for o, h in helps.items() if len(h) > 1 and o not in PER_COMMAND}
    assert not differing, differing


def test_every_command_that_prints_a_result_prints_it_as_json_too():
    listed = options()
    assert [c for c in RESULT_COMMANDS if "--json" not in listed[c]] == []
