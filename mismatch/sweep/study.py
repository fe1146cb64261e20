"""A study file: the static (probe) and dynamic (OPD) grids of a sweep, validated before any run.

    name = "quick"
    threads = 1                   # torch threads per task (default 1), the same serially and on Ray
    decide = true                 # adaptive seeds after the plan (`mismatch.sweep.decide`); default false
    max_seeds = 10                # … up to this many seeds per level (default 10)

    [static]                      # probes: every model × seed × layer scope, all specs share a reference
    models = ["smollm2-135m"]
    prompts = "prompts.txt"       # relative to the study file, or `texts = ["…"]`
    max_prompts = 4
    chat = true
    max_new_tokens = 32
    perturb = ["fp8-e4m3:channel", "int4:group128"]
    layers = ["linear"]           # scopes; `each_layer = true` adds the per-block isolation map (alone: layers = [])
    seeds = [0]

    [dynamic]                     # OPD: pairs × rollouts × losses × lrs × TIS caps × seeds
    pairs = ["sort-gpt2"]
    rollouts = ["fp8-e4m3", "stale:1"]
    losses = ["full-rkl"]
    lrs = [1e-3]
    tis_caps = [0]                # 0: off
    seeds = [0, 1, 2]

    [dynamic.settings]            # any other OPDConfig field, shared by every run
    steps = 40

A `[dynamic]` block may set its own `max_seeds` (the cap of adaptive rounds for its levels: an
expensive pair's levels can stop earlier than the study's).

Every dynamic run gets its clean baseline (the same configuration with clean rollouts) in the plan,
so every run can be judged against the clean run that shares every other field. `threads` is part
of the study: fp32 sums, hence OPD trajectories, depend on torch's thread count, so every task runs
with that many threads however the sweep is executed (serially, on a local Ray, on a cluster). The whole grid is
expanded and validated before anything runs: an unknown key, spec, pair or loss is a one-line
`InputError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

from mismatch.errors import InputError
from mismatch.opd.config import OPDConfig
from mismatch.pairs.catalog import PAIRS, pair_spec
from mismatch.probes.runs import ProbeConfig
from mismatch.files import read_toml
from mismatch.rollout.spec import RolloutSpec

STATIC_KEYS = {"models", "prompts", "texts", "max_prompts", "chat", "max_new_tokens", "min_new_tokens", "temperature",
               "perturb", "layers", "each_layer", "seeds", "per_layer", "ref_dtype"}
DYNAMIC_KEYS = {"pairs", "rollouts", "losses", "lrs", "tis_caps", "seeds", "settings", "max_seeds"}
GRID_FIELDS = {"pair", "rollout", "loss", "lr", "tis_cap", "seed"}  # set by the grid, not by settings
TOP_KEYS = ("name", "threads", "decide", "max_seeds", "static", "dynamic")


@dataclass(frozen=True)
class Plan:
    """The runs of a study, in the order they will run: probe groups (one reference pass each), then
    OPD runs (each clean baseline before the runs judged against it)."""

    probes: tuple[ProbeConfig, ...]
    opd: tuple[OPDConfig, ...]
    seed_caps: tuple[tuple[OPDConfig, int], ...] = ()  # (run at seed 0, its block's max_seeds) where a block sets one

    def max_seeds(self, config: OPDConfig, default: int) -> int:
        """The most seeds adaptive rounds give `config`'s level: its block's `max_seeds`, else `default`."""
        caps = dict(self.seed_caps)
        return caps.get(dataclasses.replace(config, seed=0), default)


@dataclass(frozen=True)
class Study:
    """A parsed study file: its name, path, plan and torch threads per task."""

    name: str
    path: Path
    plan: Plan
    threads: int = 1
    decide: bool = False  # adaptive seeds after the plan (`mismatch.sweep.decide`)
    max_seeds: int = 10


def _table(cfg: dict, key: str, valid: set[str], where: str) -> dict:
    part = cfg.get(key, {})
    if not isinstance(part, dict):
        raise InputError(f"{where}: [{key}] must be a table")
    unknown = sorted(set(part) - valid)
    if unknown:
        raise InputError(f"{where}: [{key}] unknown key {unknown[0]!r}; valid: {', '.join(sorted(valid))}")
    return part


def _list(part: dict, key: str, where: str, default: list | None = None) -> list:
    value = part.get(key, default)
    if value is None:
        raise InputError(f"{where}: missing key {key!r}")
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: {key} must be a non-empty list, got {value!r}")
    return value


def _numbers(part: dict, key: str, where: str, default: list, kind: type) -> list:
    """`_list(part, key, …)` with each entry converted by `kind` (`float`, `int`): one-line errors."""
    out = []
    for value in _list(part, key, where, default):
        try:
            if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError
            out.append(kind(value))
        except (TypeError, ValueError):
            raise InputError(f"{where}: {key} holds {value!r}, not {'an integer' if kind is int else 'a number'}") from None
    return out


def _static(part: dict, where: str, base_dir: Path) -> tuple[ProbeConfig, ...]:
    where = f"{where}: [static]"
    if not isinstance(part.get("texts", []), list):
        raise InputError(f"{where}: texts must be a list of strings, got {part['texts']!r}")
    prompts = part.get("prompts")
    if prompts is not None and (base_dir / prompts).is_file():
        prompts = str(base_dir / prompts)
    elif prompts is not None and not Path(prompts).is_file():
        raise InputError(f"{where}: prompts file not found: {prompts} (relative to the study file or the working "
                         "directory)")
    shared = {k: part[k] for k in ("max_prompts", "chat", "max_new_tokens", "min_new_tokens", "temperature",
                                   "per_layer", "ref_dtype") if k in part}
    perturb = tuple(_list(part, "perturb", where))
    _one_name_each(list(perturb), where)
    each_layer = bool(part.get("each_layer", False))
    layers = part.get("layers", ["linear"])
    if not (each_layer and layers == []):  # an isolation map alone: `layers = []`, `each_layer = true`
        layers = _list(part, "layers", where, ["linear"])
    scopes = [(scope, False) for scope in layers] + ([("linear", True)] if each_layer else [])
    configs = []
    for model, seed, (scope, each) in itertools.product(_list(part, "models", where), _numbers(part, "seeds", where, [0], int),
                                                         scopes):
        try:
            configs.append(ProbeConfig(reference=model, perturb=perturb, layers=scope, each_layer=each, seed=seed,
                                       prompts=prompts, texts=tuple(part.get("texts", ())), **shared))
        except (InputError, TypeError) as exc:
            raise InputError(f"{where}: {str(exc).splitlines()[0]}") from None
    return tuple(configs)


def _dynamic(part: dict, where: str) -> tuple[OPDConfig, ...]:
    where = f"{where}: [dynamic]"
    cap = part.get("max_seeds")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 2):
        raise InputError(f"{where}: max_seeds must be a whole number ≥ 2, got {cap!r}")
    settings = part.get("settings", {})
    if not isinstance(settings, dict):
        raise InputError(f"{where}.settings must be a table of OPD settings, got {settings!r}")
    fields = {f.name for f in dataclasses.fields(OPDConfig)} - GRID_FIELDS  # staleness, layers: shared settings
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise InputError(f"{where}.settings unknown key {unknown[0]!r}; valid: {', '.join(sorted(fields))}")
    for pair in _list(part, "pairs", where):
        if pair not in PAIRS and not str(pair).endswith(".toml"):
            raise InputError(f"{where}: unknown pair {pair!r} in pairs; known: {', '.join(PAIRS)}")
        if str(pair).endswith(".toml"):
            try:
                pair_spec(str(pair))  # the file exists and declares a pair
            except InputError as exc:
                raise InputError(f"{where}: pairs: {str(exc).splitlines()[0]}") from None
    seeds = _numbers(part, "seeds", where, [0], int)
    if cap is not None and len(set(seeds)) > cap:
        raise InputError(f"{where}: max_seeds {cap} is fewer than the {len(set(seeds))} seeds listed")
    rollouts = _list(part, "rollouts", where, ["none"])
    _one_name_each(rollouts, where)
    grid = itertools.product(_list(part, "pairs", where), _list(part, "losses", where, ["full-rkl"]),
                             _numbers(part, "lrs", where, [OPDConfig.lr], float),
                             _numbers(part, "tis_caps", where, [0], float), seeds, rollouts)
    runs: list[OPDConfig] = []
    for pair, loss, lr, tis, seed, rollout in grid:
        try:
            config = OPDConfig(**settings, pair=pair, loss=loss, lr=lr, tis_cap=tis or None, seed=seed,
                                 rollout=str(rollout))
        except InputError as exc:
            raise InputError(f"{where}: {str(exc).splitlines()[0]}") from None
        for run in (config.clean(), config):  # the baseline first, each configuration once
            run = run.clean() if run.is_clean else run  # reuse:1, stale:0 … train exactly as clean
            if run not in runs:
                runs.append(run)
    return tuple(runs)


def _one_name_each(rollouts: list, where: str) -> None:
    """Refuse two rollout (or perturbation) strings of one grid that are the same under two names (`int4` and
    `int4:group128`, `stale:0` and `none`): they would train and be reported twice, as two levels."""
    seen: dict = {}
    for text in rollouts:
        try:
            spec = RolloutSpec.parse(str(text))
        except InputError as exc:
            raise InputError(f"{where}: {str(exc).splitlines()[0]}") from None
        if spec.is_clean:  # none, stale:0, reuse:1: planned as the one clean run already
            continue
        key = dataclasses.replace(spec, text="")
        if key in seen and seen[key] != str(text):
            raise InputError(f"{where}: rollouts {seen[key]!r} and {str(text)!r} are the same rollout: list it once")
        seen.setdefault(key, str(text))


def _blocks(cfg: dict, key: str, valid: set[str], where: str) -> list[tuple[dict, str]]:
    """`[key]` as one table, or `[[key]]` as several: each with the place it is reported under."""
    value = cfg.get(key, [])
    blocks = value if isinstance(value, list) else [value]
    out = []
    for i, block in enumerate(blocks):
        label = f"{where}: [[{key}]] #{i + 1}" if isinstance(value, list) else where
        if isinstance(block, dict) and "name" in block:
            label = f"{where}: [[{key}]] {block['name']!r}"
            block = {k: v for k, v in block.items() if k != "name"}
        out.append((_table({key: block}, key, valid, label), label))
    return out


def plan_study(cfg: dict, *, where: str = "study", base_dir: Path = Path(".")) -> Plan:
    """Expand and validate a study given as a parsed TOML mapping (see the module docstring).

    `[static]` and `[dynamic]` may each be given several times as arrays of tables (`[[dynamic]]`,
    each with an optional `name`): the plan is their union, each run once, in order.

    Raises:
        InputError: an unknown key, spec, pair or loss, or a bad value; one line naming `where` and the key.
    """
    unknown = sorted(set(cfg) - set(TOP_KEYS))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(TOP_KEYS)}")
    if "static" not in cfg and "dynamic" not in cfg:
        raise InputError(f"{where}: a study needs a [static] or a [dynamic] table")
    static = [c for part, label in _blocks(cfg, "static", STATIC_KEYS, where) for c in _static(part, label, base_dir)]
    dynamic, caps = [], {}
    for part, label in _blocks(cfg, "dynamic", DYNAMIC_KEYS, where):
        runs = _dynamic(part, label)
        dynamic += runs
        if "max_seeds" in part:
            for run in runs:
                if not run.is_clean:  # a level's cap; clean twins follow their levels
                    caps[dataclasses.replace(run, seed=0)] = int(part["max_seeds"])
    if not static and not dynamic:
        raise InputError(f"{where}: the study plans no run (its [static] and [dynamic] tables are empty)")
    return Plan(tuple(dict.fromkeys(static)), tuple(dict.fromkeys(dynamic)), tuple(caps.items()))


def load_study(path: str | Path) -> Study:
    """Read, expand and validate a study file (`plan_study`); nothing runs.

    Raises:
        InputError: a missing or invalid file, or an invalid study.
    """
    path = Path(path)
    cfg = read_toml(path, "study file")
    threads, max_seeds, decide = cfg.get("threads", 1), cfg.get("max_seeds", Study.max_seeds), cfg.get("decide", False)
    for key, value, least in (("threads", threads, 1), ("max_seeds", max_seeds, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{path}: {key} must be a whole number ≥ {least}, got {value!r}")
    if not isinstance(decide, bool):
        raise InputError(f"{path}: decide must be true or false, got {decide!r}")
    return Study(str(cfg.get("name", path.stem)), path, plan_study(cfg, where=str(path), base_dir=path.parent),
                 threads, decide, max_seeds)
