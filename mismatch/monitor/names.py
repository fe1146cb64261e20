"""The frameworks' names for rollout/training mismatch statistics, each mapped onto the definition it follows
in the mode (configuration) the run had.

The calibrated limits (`mismatch thresholds`, the shipped file) are of the check's own statistics
(`mismatch.metrics.sampled_token_metrics` under `mismatch_*`), with `log r = log π_train(y) − log
π_rollout(y)` per sampled token. A logged name is *comparable* when, in the run's mode, it is the same number
by definition (the same formula, or an exact conversion of logged values of the same step); any other known
name is listed with why it is not, and is drawn but never judged against a limit.

Each `Name` is a decision table: its `Case`s, tried in order, each a condition on the run's framework settings
(`Setting`: where a framework's config holds it, and the framework's own default) and what the name is
then. A setting that no config read shows leaves the name's mode unknown, and the name is not judged, unless
its `unknown` case says how it is read anyway (prime-rl's `mismatch_kl`, whose definition is fixed but whose
value may mix staleness in). The settings come from `resolve_settings`: a config the user gives, the config
the log carries (NeMo RL's TensorBoard hparams), and for a log of the toolkit's own statistics
`mismatch.metrics.ROLLOUT_STATS_CONFIG`, the mode `rollout_stats` computes the frameworks' names in.

Followed, file:line cited at each: verl 0.9.1, slime 624b824, NeMo RL 7ea279a, prime-rl 559b447.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mismatch.defaults import DEFAULT_CLIP
from mismatch.errors import InputError

TOOLKIT = ("mismatch_kl", "mismatch_k3", "mismatch_logp_abs_diff_mean", "mismatch_chi2_token",
           "mismatch_is_ratio_outside_frac")  # the check's own statistics, under their own names


class _NoDefault:
    def __repr__(self) -> str:
        return "no default"


NO_DEFAULT = _NoDefault()


@dataclass(frozen=True)
class Setting:
    """One framework setting a logged name's meaning depends on. `paths`: the dotted keys a config holds it
    under, the first its name (a nested config is flattened with `.`); `default`: the framework's own,
    applied when a config of that framework is read but leaves it out; `source`: where both are defined."""

    framework: str
    paths: tuple[str, ...]
    default: object
    source: str

    @property
    def key(self) -> str:
        return self.paths[0]


Get = Callable[[Setting], object]  # a setting's value in the run being read (raises when no config shows it)
Text = str | Callable[[Get], str]


def _same(x: float) -> float:
    return x


def _sum(a: float, b: float) -> float:
    return a + b


def _neg(x: float) -> float:
    return -x


def _always(get: Get) -> bool:
    return True


@dataclass(frozen=True)
class Case:
    """One mode of a logged name: when `when(get)` holds, the name is `statistic` (through `convert` of the
    logged values, in `needs` order) or, with `statistic` None, not comparable. `mode`: the condition in
    words, as the framework's config spells it (empty: the name means one thing in every mode); `how`: the
    definition and why it is the same number, or why it is not; `caveat`: what a judge of it must know (it
    is still judged)."""

    when: Callable[[Get], bool]
    mode: str
    how: Text
    statistic: str | None = None
    convert: Callable[..., float] = _same
    caveat: Text | None = None


@dataclass(frozen=True)
class Name:
    """A framework's logged name (or the names a conversion needs, all of one step) and its modes."""

    needs: tuple[str, ...]
    framework: str
    cases: tuple[Case, ...]
    unknown: Case | None = None  # read as this when a setting its cases test is unknown (None: not judged)

    @property
    def logged_as(self) -> str:
        return " + ".join(self.needs)


@dataclass(frozen=True)
class FrameworkGate:
    """A limit the framework itself applies in the run (`setting`, None: off) to a name it logs."""

    framework: str
    setting: Setting
    logged_as: str
    how: str


@dataclass(frozen=True)
class Meaning:
    """What a `Name` is in the run being read: its `case` (None: not comparable or mode unknown), the text
    saying so (`why`), and the settings read to decide (`read`: key → (value, where it came from))."""

    case: Case | None
    why: str
    caveat: str | None
    read: dict[str, tuple[object, str]]

    @property
    def comparable(self) -> bool:
        return self.case is not None and self.case.statistic is not None


def _flag(value: object) -> bool:
    """A boolean setting as configs hold it: YAML/TOML booleans, TensorBoard hparams' 1.0/0.0 (torch's
    `hparams` stores a bool as a number), or the strings `true`/`false`."""
    if isinstance(value, str):
        if value.strip().lower() not in ("true", "false", "1", "0"):
            raise InputError(f"not a boolean setting value: {value!r}")
        return value.strip().lower() in ("true", "1")
    return bool(value)


def _text(text: Text, get: Get) -> str:
    return text if isinstance(text, str) else text(get)


# ---------------------------------------------------------------- verl 0.9.1

_VERL = "verl/trainer/config/algorithm.py"
VERL_ROLLOUT_IS = Setting("verl", ("algorithm.rollout_correction.rollout_is", "rollout_correction.rollout_is",
                                   "rollout_is"), NO_DEFAULT,
                          f"{_VERL}:179 (the dataclass default 'sequence'; the trainer yaml's null logs no shares)")
VERL_IS_THRESHOLD = Setting("verl", ("algorithm.rollout_correction.rollout_is_threshold",
                                     "rollout_correction.rollout_is_threshold", "rollout_is_threshold"), 2.0,
                            f"{_VERL}:180, trainer/config/algorithm/rollout_correction.yaml:11")


def verl_is_bounds(spec: object) -> tuple[float, float]:
    """`(lower, upper)` of verl's `rollout_is_threshold`: a number (or numeric string) is the upper bound and
    its reciprocal the lower one, `"lower_upper"` both (rollout_corr_helper.py:93-130 `_parse_rollout_is_
    threshold`; the reciprocal at 695-697)."""
    try:
        if isinstance(spec, bool):
            raise ValueError
        if isinstance(spec, str) and "_" in spec:
            lower, upper = (float(x) for x in spec.strip().split("_", 1))
        else:
            upper = float(spec)  # type: ignore[arg-type]
            lower = 1.0 / upper
    except (TypeError, ValueError, ZeroDivisionError):
        raise InputError(f"verl's rollout_is_threshold is a number or 'lower_upper', got {spec!r}") from None
    return lower, upper


def _calibrated_bounds(get: Get) -> bool:
    lower, upper = verl_is_bounds(get(VERL_IS_THRESHOLD))
    return math.isclose(lower, 1.0 / DEFAULT_CLIP, rel_tol=1e-12) and math.isclose(upper, DEFAULT_CLIP, rel_tol=1e-12)


def _other_bounds(get: Get) -> str:
    lower, upper = verl_is_bounds(get(VERL_IS_THRESHOLD))
    return (f"shares of tokens with r outside [{lower:.3g}, {upper:.3g}] (rollout_is_threshold), not the calibrated "
            f"[{1 / DEFAULT_CLIP:.3g}, {DEFAULT_CLIP:.3g}]")


_VERL_SHARES = ("rollout_corr/rollout_is_ratio_fraction_high", "rollout_corr/rollout_is_ratio_fraction_low")
_HELPER = "rollout_corr_helper.py"

# ---------------------------------------------------------------- slime 624b824

_ARGS = "slime/utils/arguments.py"
SLIME_PER_TOKEN_LOSS = Setting("slime", ("calculate_per_token_loss",), False,
                               f"{_ARGS}:879 (--calculate-per-token-loss)")
SLIME_USE_TIS = Setting("slime", ("use_tis",), False, f"{_ARGS}:1061 (--use-tis)")
SLIME_MISMATCH_METRICS = Setting("slime", ("get_mismatch_metrics",), False, f"{_ARGS}:1027 (--get-mismatch-metrics)")
SLIME_TIS_FUNCTION = Setting("slime", ("custom_tis_function_path",), None, f"{_ARGS}:1079 (--custom-tis-function-path)")
SLIME_USE_RS = Setting("slime", ("use_rs",), NO_DEFAULT, "examples/train_infer_mismatch_helper/mis.yaml:3 (mis.py's "
                                                        "own config; read at mis.py:244)")
SLIME_TIS_MODE = Setting("slime", ("tis_mode",), NO_DEFAULT, "examples/train_infer_mismatch_helper/mis.yaml:16 "
                                                            "(read at mis.py:226-235)")
_MIS = "train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"  # slime's own MIS function


def _is_mis(path: object) -> bool:
    """`--custom-tis-function-path` names slime's example MIS function (as a module path or a file path)."""
    return isinstance(path, str) and path.replace("/", ".").replace(".py:", ".").replace(":", ".").endswith(_MIS)


def _masks_unchanged(get: Get) -> bool:
    """The loss masks reach `train_rollout_logprob_abs_diff`'s numerator as they are: no TIS function runs
    (loss.py:1050), or the default one, which returns them (loss.py:884-905)."""
    return get(SLIME_TIS_FUNCTION) is None or not (_flag(get(SLIME_USE_TIS)) or _flag(get(SLIME_MISMATCH_METRICS)))


def _mis_keeps_masks(get: Get) -> bool:
    """slime's mis.py returns the loss masks unless TIS is on and it masks tokens: `tis_mode = mask` or
    rejection sampling (mis.py:208-209, 232-262)."""
    if not _is_mis(get(SLIME_TIS_FUNCTION)):
        return False
    return not _flag(get(SLIME_USE_TIS)) or (not _flag(get(SLIME_USE_RS)) and get(SLIME_TIS_MODE) != "mask")


_PER_ROLLOUT = ("slime's default per-rollout mean: each rollout's token mean, averaged over the step's rollouts "
                "(cp_utils.py:73-91, observability/train_metric_utils.py:53-59; every sample its own rollout, "
                "ray/rollout.py:647-655): sequence-weighted")
_PER_TOKEN = ("the token mean over the step's loss-masked tokens (sum_of_token, cp_utils.py:83-98, divided by "
              "their count, loss.py:1317 and train_metric_utils.py:53-54); exact when every sample has a "
              "loss-masked token: slime counts a sample without one as one token, so k such samples among N "
              "tokens scale the value by N/(N+k)")
_NOT_PER_TOKEN = "calculate_per_token_loss off (slime's default)"
_ABS_DIFF = "|log p − log q| per token (loss.py:1136-1140)"


def _per_rollout(definition: str) -> Case:
    """A slime train metric without --calculate-per-token-loss: not comparable."""
    return Case(lambda get: not _flag(get(SLIME_PER_TOKEN_LOSS)), _NOT_PER_TOKEN, f"{definition}, as {_PER_ROLLOUT}")


def _slime_token_mean(statistic: str, definition: str) -> tuple[Case, ...]:
    """A slime train metric reduced by the loss's reducer: its token mean only with --calculate-per-token-loss."""
    return (_per_rollout(definition),
            Case(_always, "calculate_per_token_loss on", f"{definition}, {_PER_TOKEN}: {statistic}", statistic))


# ---------------------------------------------------------------- NeMo RL 7ea279a

NEMO_KL_TYPE = Setting("NeMo RL", ("loss_fn.reference_policy_kl_type",), "k3",
                       "nemo_rl/algorithms/loss/loss_functions.py:131")
NEMO_SEQ_THRESHOLD = Setting("NeMo RL", ("grpo.seq_logprob_error_threshold", "ppo.seq_logprob_error_threshold"),
                             None, "nemo_rl/algorithms/grpo.py:296, ppo.py:214")
_LOSS = "loss_functions.py"
_NEMO_MEAN = "the token mean over the step's masked tokens (masked_mean by global_valid_toks, utils.py:212-224)"


def _kl_type(kind: str) -> Callable[[Get], bool]:
    return lambda get: get(NEMO_KL_TYPE) == kind


# ---------------------------------------------------------------- prime-rl 559b447

PRIME_MAX_OFF_POLICY = Setting("prime-rl", ("orchestrator.max_off_policy_steps", "max_off_policy_steps"), 8,
                               "packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py:532")
_PRIME_K3 = ("mean of r − log r − 1 over the loss-masked tokens of the step's batch (trainer/rl/loss.py:100-106, "
             "trainer/rl/train.py:499-512, trainer/utils.py:272): prime-rl's `mismatch_kl` is the k3 estimator, "
             "mismatch_k3 (not mismatch_kl, the k1 one)")


def _staleness(steps: object, source: str) -> str:
    return (f"its value mixes staleness with engine mismatch: prime-rl compares the trainer's current policy with "
            f"the inference policy that sampled, up to {steps} policy versions older ({source}); a crossing may be "
            "staleness, not the engine")


# ---------------------------------------------------------------- the table

def _fixed(needs: tuple[str, ...], framework: str, how: str, statistic: str | None = None,
           convert: Callable[..., float] = _same) -> Name:
    """A name that means one thing in every mode."""
    return Name(needs, framework, (Case(_always, "", how, statistic, convert),))


_MEAN = "mean over tokens"
NAMES: tuple[Name, ...] = (
    # the toolkit's own names: `mismatch opd` rows, `MismatchDistillationTrainer` logs, any loop using `judge`
    *(_fixed((name,), "mismatch", "the check's own definition", name) for name in TOOLKIT),
    _fixed(("rollout_corr/kl",), "verl", f"{_MEAN} of −log r (k1 estimate of KL(π_rollout‖π_train), "
           f"{_HELPER}:959), as mismatch_kl", "mismatch_kl"),
    _fixed(("rollout_corr/k3_kl",), "verl", f"{_MEAN} of r − 1 − log r, log r not clamped ({_HELPER}:963-966), "
           "as mismatch_k3", "mismatch_k3"),
    _fixed(("rollout_corr/chi2_token",), "verl", f"{_MEAN} of r² − 1; verl clamps log r to ±20 first "
           f"({_HELPER}:997-1001; the same number unless a token's |log r| > 20)", "mismatch_chi2_token"),
    Name(_VERL_SHARES, "verl", (
        Case(lambda get: get(VERL_ROLLOUT_IS) == "sequence", "rollout_is = sequence (verl's dataclass default)",
             f"shares of sequences whose ∏ r lies outside the threshold's bounds ({_HELPER}:578-586, 704-718): "
             "a sequence-level share, not a token one"),
        Case(lambda get: get(VERL_ROLLOUT_IS) == "token" and _calibrated_bounds(get),
             f"rollout_is = token, rollout_is_threshold = {DEFAULT_CLIP:g}",
             f"share of tokens with r > {DEFAULT_CLIP:g} plus share with r < {1 / DEFAULT_CLIP:g} ({_HELPER}:720-733): the "
             f"check's clip {DEFAULT_CLIP:g}", "mismatch_is_ratio_outside_frac", _sum),
        Case(lambda get: get(VERL_ROLLOUT_IS) == "token", "rollout_is = token, another rollout_is_threshold",
             _other_bounds),
        Case(_always, "another rollout_is", lambda get: f"rollout_is = {get(VERL_ROLLOUT_IS)!r}: not a level verl "
                                                        "0.9.1 computes these shares at"))),
    _fixed(("rollout_corr/log_ppl_diff",), "verl", "mean over sequences of per-sequence mean log-prob differences: "
           "sequence-weighted, not mismatch_kl's token mean"),
    _fixed(("rollout_corr/log_ppl_abs_diff",), "verl", "mean over sequences of |per-sequence mean log-prob "
           "difference|"),
    _fixed(("rollout_corr/ppl_ratio",), "verl", "mean over sequences of a perplexity ratio"),
    _fixed(("rollout_corr/chi2_seq",), "verl", "sequence-level χ² of ∏ r: no token-level limit"),
    _fixed(("rollout_corr/rollout_is_eff_sample_size",), "verl", "ESS of TIS-truncated weights"),
    _fixed(("rollout_corr/rollout_rs_seq_masked_fraction",), "verl", "share of sequences rejected by verl's "
           "rejection sampling"),
    _fixed(("training/rollout_probs_diff_mean",), "verl", "mean |p_train − p_rollout| of probabilities, not "
           "log-probs"),
    _fixed(("training/rollout_probs_diff_max",), "verl", "max |p_train − p_rollout| of probabilities"),
    Name(("train/mis_kl",), "slime", _slime_token_mean(
        "mismatch_kl", "log q − log p per token (mis.py:407-408), reduced with the pre-RS masks "
                       "(loss.py:1156-1163)")),
    Name(("train/mis_k3_kl",), "slime", _slime_token_mean(
        "mismatch_k3", "r − log r − 1 per token (mis.py:412-415), reduced with the pre-RS masks "
                       "(loss.py:1156-1163)")),
    Name(("train/train_rollout_logprob_abs_diff",), "slime", (
        _per_rollout(_ABS_DIFF),
        Case(_masks_unchanged, "calculate_per_token_loss on, no TIS function",
             f"{_ABS_DIFF}, {_PER_TOKEN}: mismatch_logp_abs_diff_mean", "mismatch_logp_abs_diff_mean"),
        Case(_mis_keeps_masks, "calculate_per_token_loss on, mis.py keeping the loss masks",
             f"{_ABS_DIFF}, {_PER_TOKEN}: mismatch_logp_abs_diff_mean", "mismatch_logp_abs_diff_mean"),
        Case(_always, "calculate_per_token_loss on, a TIS function that may reject tokens",
             "its numerator sums |log r| over the tokens the TIS/RS function's returned masks keep, its "
             "denominator counts all loss-masked tokens (loss.py:1080-1091, 1136-1140): not the token mean"))),
    Name(("train/gen_kl_error",), "NeMo RL", (
        Case(_kl_type("k3"), "loss_fn.reference_policy_kl_type = k3 (NeMo RL's default)",
             f"calculate_kl(generation, prev) unclamped = r − 1 − log r per token ({_LOSS}:416-427, "
             "utils.py:72-90), "
             f"{_NEMO_MEAN}: mismatch_k3", "mismatch_k3"),
        Case(_kl_type("k1"), "loss_fn.reference_policy_kl_type = k1",
             f"calculate_kl(generation, prev) = −log r per token ({_LOSS}:416-427, utils.py:72-85), {_NEMO_MEAN}: "
             "mismatch_kl", "mismatch_kl"),
        Case(_always, "another loss_fn.reference_policy_kl_type",
             lambda get: f"reference_policy_kl_type = {get(NEMO_KL_TYPE)!r}: under k2 the token mean of (log r)²/2 "
                         "(utils.py:86-87), no calibrated statistic"))),
    Name(("train/policy_kl_error",), "NeMo RL", (
        Case(_kl_type("k1"), "loss_fn.reference_policy_kl_type = k1",
             f"calculate_kl(prev, generation) = log r per token ({_LOSS}:431-442, utils.py:72-85), {_NEMO_MEAN}: "
             "−mismatch_kl, read negated", "mismatch_kl", _neg),
        Case(_always, "loss_fn.reference_policy_kl_type other than k1",
             lambda get: f"reference_policy_kl_type = {get(NEMO_KL_TYPE)!r}: the k3 or k2 of −log r on tokens "
                         "sampled from the rollout policy (utils.py:72-90), no calibrated statistic"))),
    _fixed(("train/js_divergence_error",), "NeMo RL", f"token mean of a k3-style Jensen–Shannon term against the "
           f"two policies' mixture at the sampled token ({_LOSS}:445-466): no calibrated statistic"),
    _fixed(("train/token_mult_prob_error",), "NeMo RL", "mean over tokens of exp|log r|: no exact map to a mean "
           "of |log r|"),
    *(_fixed((f"train/{stat}_seq_mult_prob_error",), "NeMo RL", f"the {stat} over sequences of each one's mean "
             "exp|log r| (grpo.py:2538-2566): per sequence, no calibrated statistic")
      for stat in ("max", "mean", "min")),
    Name(("mismatch_kl/all/mean",), "prime-rl", (
        Case(lambda get: int(get(PRIME_MAX_OFF_POLICY)) == 0, "orchestrator.max_off_policy_steps = 0",
             f"{_PRIME_K3}; on-policy rollouts, so engine mismatch only", "mismatch_k3"),
        Case(_always, "orchestrator.max_off_policy_steps > 0", _PRIME_K3, "mismatch_k3",
             caveat=lambda get: _staleness(int(get(PRIME_MAX_OFF_POLICY)), "orchestrator.max_off_policy_steps"))),
        unknown=Case(_always, "orchestrator.max_off_policy_steps unknown", _PRIME_K3, "mismatch_k3",
                     caveat=_staleness(PRIME_MAX_OFF_POLICY.default, "prime-rl's default orchestrator.max_off_policy_"
                                                                     "steps: no config read gives it"))),
    _fixed(("masked_mismatch_kl/mean",), "prime-rl", "mean over samples of the k3 mean over each one's masked tokens"),
    _fixed(("unmasked_mismatch_kl/mean",), "prime-rl", "mean over samples of the k3 mean over each one's kept tokens"),
)

GATES: tuple[FrameworkGate, ...] = (
    FrameworkGate("NeMo RL", NEMO_SEQ_THRESHOLD, "train/max_seq_mult_prob_error",
                  "NeMo RL masks every sequence whose mean exp|log r| is above it (grpo.py:2581-2611): a step whose "
                  "largest is above it masked at least one sequence"),
)

SETTINGS: tuple[Setting, ...] = (VERL_ROLLOUT_IS, VERL_IS_THRESHOLD, SLIME_PER_TOKEN_LOSS, SLIME_USE_TIS,
                                 SLIME_MISMATCH_METRICS, SLIME_TIS_FUNCTION, SLIME_USE_RS, SLIME_TIS_MODE,
                                 NEMO_KL_TYPE, NEMO_SEQ_THRESHOLD, PRIME_MAX_OFF_POLICY)


def flat_config(config: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """A nested config as dotted keys (`{"a": {"b": 1}}` → `{"a.b": 1}`); keys already dotted stay."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, name + "."))
        else:
            flat[name] = value
    return flat


def resolve_settings(layers: Sequence[tuple[Mapping[str, object], str]]) -> dict[str, tuple[object, str]]:
    """Each `Setting` a config shows: `key → (value, where)`, from the first of `layers` (flat configs, each
    with where it comes from, first wins) holding one of its paths, else the framework's own default when a
    layer holds any setting of that framework. A setting in none stays out (its mode unknown)."""
    seen = {s.framework for s in SETTINGS for config, _ in layers if any(p in config for p in s.paths)}
    resolved: dict[str, tuple[object, str]] = {}
    for setting in SETTINGS:
        found = next(((config[p], where) for config, where in layers for p in setting.paths if p in config), None)
        if found is None and setting.framework in seen and setting.default is not NO_DEFAULT:
            found = (setting.default, f"{setting.framework}'s default, {setting.source}")
        if found is not None:
            resolved[setting.key] = found
    return resolved


class _Unknown(Exception):
    def __init__(self, setting: Setting):
        self.setting = setting


def meaning(name: Name, settings: Mapping[str, tuple[object, str]]) -> Meaning:
    """What `name` is under `settings` (`resolve_settings`): the first case whose condition holds; if a
    condition needs a setting no config shows, `name.unknown` or, without one, not judged (mode unknown)."""
    read: dict[str, tuple[object, str]] = {}

    def get(setting: Setting) -> object:
        if setting.key not in settings:
            raise _Unknown(setting)
        read[setting.key] = settings[setting.key]
        return settings[setting.key][0]

    for case in name.cases:
        try:
            if case.when(get):
                caveat = None if case.caveat is None else _text(case.caveat, get)
                why = _text(case.how, get) + (f" ({case.mode})" if case.mode else "")
                return Meaning(case, why, caveat, read)
        except InputError:
            raise
        except (TypeError, ValueError) as exc:
            shown = ", ".join(f"{k} = {v!r} ({where})" for k, (v, where) in read.items())
            raise InputError(f"{name.logged_as}: a setting its mode depends on has a value it cannot take: {shown} "
                             f"({exc})") from None
        except _Unknown as unknown:
            if name.unknown is not None:  # its texts are plain: no setting is read for them
                fallback = name.unknown
                return Meaning(fallback, f"{_text(fallback.how, get)} ({fallback.mode})",
                               None if fallback.caveat is None else _text(fallback.caveat, get), read)
            modes = "; ".join(f"as {c.statistic} only when {c.mode}" for c in name.cases if c.statistic)
            return Meaning(None, f"mode unknown: {unknown.setting.key} is in no config read ({name.framework}'s "
                                 f"run config: --framework-config FILE); comparable {modes}", None, read)
    raise AssertionError(f"{name.logged_as}: no case matched (the last case of a name is its catch-all)")


def comparable_names() -> set[str]:
    """Every logged name a calibrated statistic is read from, in some mode."""
    return {n for name in NAMES if any(c.statistic for c in name.cases) for n in name.needs}
