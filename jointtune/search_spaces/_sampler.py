"""An Optuna sampler that proposes only configs the space takes for one problem on one device.

Optuna samples each param from its own fixed distribution (the space's full choices, as `Space.suggest` asks
them): it can't know that `BLOCK_N <= kv_split` or that heads_per_program must divide the GQA group, so a sampler
on its own proposes configs the space refuses (34 and 41 of 20-trial Flash-Decode tunes did, issue 34). This
wrapper draws the whole config at once, the first time a trial asks for a param:

1. the wrapped sampler's joint proposal (`sample_relative`: multivariate TPE over the params history groups
   together), completed in definition order: `mode` first, then the params that mode's conditions activate,
   each one the proposal lacks drawn by the wrapped sampler on its own (`sample_independent`); values the
   trial has fixed (`enqueue_trial`) are kept;
2. if the space refuses it, another draw (up to `redraws`, 8): the first valid draw is a draw of the wrapped
   sampler's distribution restricted to the valid space. Moving every refused draw to its nearest valid
   config instead piles proposals onto the edges of the valid region (on the 2x H200 ground truth of ag_gemm
   1024x8192x8192 a random search then needed up to 45 trials and missed once in 10 seeds, against at most 40);
3. the last resort, when every draw was refused (a space where few configs are valid): the valid config
   nearest to the first draw (`Space.nearest_valid`: same mode where possible, then the fewest steps away),
   keeping the fixed values.
What happened is kept in `moved` (trial id -> {"redrawn", "fields", "why"}) for the tuner to note on the trial.

Every param is answered from the drawn config (`infer_relative_search_space` claims them all), so the trial's
params are exactly what runs, and the wrapped sampler learns from valid configs only. Where fixed values leave
no valid config, the proposal is returned as drawn and the space's check refuses it as before.

Example:
    >>> import optuna
    >>> from jointtune.search_spaces import DeviceLimits, get_space
    >>> space, limits = get_space("flash_decode"), DeviceLimits.nominal_hopper()
    >>> problem = space.make_problem("8x64x8x131072x128", world_size=2)
    >>> study = optuna.create_study(sampler=space.sampler(optuna.samplers.RandomSampler(seed=0), problem, limits))
    >>> configs = [space.suggest(study.ask(), problem, limits) for _ in range(20)]
    >>> sum(bool(space.violations(c, problem, limits)) for c in configs)
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optuna.samplers import BaseSampler

from jointtune.errors import SpaceError
from jointtune.search_spaces._params import rule_field

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

    from jointtune.search_spaces._problem import DeviceLimits, Problem
    from jointtune.search_spaces._space import Space


class ValidSampler(BaseSampler):
    """`base` proposing only valid configs of `space` for `problem` on `limits` (module docstring)."""

    def __init__(
        self, base: BaseSampler, space: Space, problem: Problem, limits: DeviceLimits, *, seed: int, redraws: int = 8
    ) -> None:
        self.base, self.space, self.problem, self.limits, self.seed = base, space, problem, limits, seed
        self.redraws = redraws
        #: trial id -> {"redrawn": draws the space refused, "fields": the fields the last resort moved (none if a
        #: draw was valid), "why": the fields or rules the refused draws broke}
        self.moved: dict[int, dict[str, list[str]]] = {}
        self._base_spaces: dict[int, dict[str, BaseDistribution]] = {}

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        self._base_spaces[trial._trial_id] = self.base.infer_relative_search_space(study, trial)
        return dict(self.space.distributions())

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        fixed = dict(trial.system_attrs.get("fixed_params", {}))
        base_space = self._base_spaces.pop(trial._trial_id, None)
        if base_space is None:
            base_space = self.base.infer_relative_search_space(study, trial)
        first: dict[str, Any] | None = None
        broken: set[str] = set()
        for draw in range(1 + self.redraws):
            config = self._draw(study, trial, base_space, search_space, fixed)
            problems = self.space.violations(config, self.problem, self.limits)
            if not problems:
                if draw:
                    self.moved[trial._trial_id] = {"redrawn": draw, "fields": [], "why": sorted(broken)}
                return {name: value for name, value in config.items() if name not in fixed}
            broken.update(rule_field(m) for m in problems)
            first = first or config
        assert first is not None
        config = self._repair(trial, first, fixed, sorted(broken))
        return {name: value for name, value in config.items() if name not in fixed}

    def _draw(
        self,
        study: Study,
        trial: FrozenTrial,
        base_space: dict[str, BaseDistribution],
        search_space: dict[str, BaseDistribution],
        fixed: dict[str, Any],
    ) -> dict[str, Any]:
        """One proposal of the wrapped sampler: its joint draw, completed param by param in definition order."""
        joint = self.base.sample_relative(study, trial, base_space) if base_space else {}
        config: dict[str, Any] = {}
        for p in self.space.params:
            if p.when is not None and not p.when.holds(config):
                continue
            if p.name in fixed:
                config[p.name] = fixed[p.name]
            elif len(p.choices) == 1:
                config[p.name] = p.choices[0]
            elif p.name in joint:
                config[p.name] = joint[p.name]
            else:
                config[p.name] = self.base.sample_independent(study, trial, p.name, search_space[p.name])
        return config

    def _repair(
        self, trial: FrozenTrial, config: dict[str, Any], fixed: dict[str, Any], broken: list[str]
    ) -> dict[str, Any]:
        pinned = {name: value for name, value in fixed.items() if name in config}
        try:
            near = self.space.nearest_valid(config, self.problem, self.limits, pinned=pinned, seed=self.seed)
        except SpaceError:  # a fixed value that is no choice at all: the space's check says so by name
            near = None
        if near is None:
            return config
        fields = [name for name in {**config, **near} if config.get(name) != near.get(name)]
        self.moved[trial._trial_id] = {"redrawn": self.redraws, "fields": fields, "why": broken}
        return near

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
