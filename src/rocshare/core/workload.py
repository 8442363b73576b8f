"""A pool's typical workload learnt from what it runs: the FGD measure's input, kept current.

`WorkloadWindow` holds the request shapes of the last `window` pods a pool was given (pods it
holds and pods it has held; one sample per pod), as a count per shape updated by `add` in
O(1). `model()` returns a `FragmentationModel` of the window, looked at again only after `rebuild_every`
new samples and replaced only when the workload moved (task weights in whole percent): a model
carries a memo, and every decision cached for the old one is dropped with it, so it must not
change on every bind.

Until the window holds `prior_pods` samples, a prior is mixed in as pseudo-samples, weighing
`prior_pods - seen` pods: with nothing seen the model is the prior alone; from `prior_pods`
samples on, the pool's own pods alone. The prior (PRIOR_SHAPES) is the openb trace's
GPU-pod mix (the FGD paper's production trace, ../shared/traces/openb) rounded: 55 % one whole
GPU, shares of 3/4, 1/2 and 1/4 of a GPU at 15 %, 15 % and 10 %, 3 % two whole GPUs and
2 % eight. CPU is 0 in the prior (the CPU of a pool's pods is unknown until seen); the pool's own
samples carry their pods' CPU requests, so the CPU side of the measure applies as they replace it.

A shape is FGD's task group: (cpu_milli, gpus, share_milli per GPU, accepted products).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from rocshare.core.fragmentation import FragmentationModel, TypicalTask, TypicalWorkload

Shape = tuple[int, int, int, tuple[str, ...]]
PRIOR_SHAPES: dict[Shape, float] = {
    (0, 1, 1000, ()): 0.55,
    (0, 1, 750, ()): 0.15,
    (0, 1, 500, ()): 0.15,
    (0, 1, 250, ()): 0.10,
    (0, 2, 1000, ()): 0.03,
    (0, 8, 1000, ()): 0.02,
}
WINDOW_PODS = 2000
PRIOR_PODS = 200
REBUILD_EVERY = 50
COVERAGE = 0.95
WEIGHT_DIGITS = 2


@dataclass
class WorkloadWindow:
    window: int = WINDOW_PODS
    prior_pods: int = PRIOR_PODS
    rebuild_every: int = REBUILD_EVERY
    _samples: deque[Shape] = field(default_factory=deque)
    _counts: Counter[Shape] = field(default_factory=Counter)
    _since_build: int = 0
    _model: FragmentationModel | None = None

    @property
    def seen(self) -> int:
        """Samples in the window."""
        return len(self._samples)

    def add(self, shape: Shape) -> None:
        self._samples.append(shape)
        self._counts[shape] += 1
        if len(self._samples) > self.window:
            old = self._samples.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._since_build += 1

    def model(self) -> FragmentationModel:
        """The current model: rebuilt when `rebuild_every` samples arrived since the last one
        (and while the prior still weighs, when any did: few pods move it a lot then)."""
        stale = self._since_build >= self.rebuild_every or (self._since_build and self.seen <= self.prior_pods)
        if self._model is None or stale:
            self._since_build = 0
            workload = self.workload()
            if self._model is None or workload != self._model.workload:
                self._model = FragmentationModel(workload)
        return self._model

    def workload(self) -> TypicalWorkload:
        """The window's shapes plus the fading prior; the most frequent kept until they cover
        COVERAGE of the weight (FGD's typical workload), renormalised."""
        weights: dict[Shape, float] = {shape: float(count) for shape, count in self._counts.items()}
        prior_weight = max(0, self.prior_pods - self.seen)
        for shape, share in PRIOR_SHAPES.items():
            if prior_weight:
                weights[shape] = weights.get(shape, 0.0) + share * prior_weight
        total = sum(weights.values())
        kept: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, weight in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
            if total and covered / total >= COVERAGE:
                break
            kept.append((shape, weight))
            covered += weight
        # Weights in whole percent: a model that did not move keeps its object, memo and the
        # decisions cached for it (a new model drops them all).
        return TypicalWorkload(tuple(TypicalTask(c, g, s, t, round(w / covered, WEIGHT_DIGITS)) for (c, g, s, t), w in kept))
